"""The one integer check and the one number check (spekula.config.is_int, is_number), and the options that use them."""

from __future__ import annotations

import math

import pytest

from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig, is_int, is_number
from spekula.errors import ConfigError


@pytest.mark.parametrize(
    "value, integer, number",
    [
        (0, True, True),
        (-3, True, True),
        (2.5, False, True),
        (2.0, False, True),
        (True, False, False),
        (False, False, False),
        (math.nan, False, False),
        (math.inf, False, False),
        (-math.inf, False, False),
        (10**400, True, True),  # past any float, still a number (a range check then refuses it)
        ("3", False, False),
        (None, False, False),
    ],
)
def test_a_bool_is_never_a_count_and_a_non_finite_float_never_a_number(value, integer, number):
    assert is_int(value) is integer and is_number(value) is number


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SamplingParams(top_k=True), "top_k must be an integer"),
        (lambda: SamplingParams(top_p=True), "top_p must be in"),
        (lambda: SamplingParams(temperature=True), "temperature must be a finite number"),
        (lambda: SamplingParams(seed=False), "seed must be an integer"),
        (lambda: SpecConfig(k=True), "k (draft length) must be an integer"),
        (lambda: SpecConfig(k_max=True), "--k-max must be an integer"),
        (lambda: SpecConfig(ngram_min=True), "--ngram-min must be an integer"),
        (lambda: StopConfig(max_tokens=True), "max_tokens must be an integer"),
        (lambda: BackendConfig(threads=True), "threads must be an integer"),
        (lambda: BackendConfig(context_length=True), "context_length must be an integer"),
    ],
)
def test_every_option_refuses_a_bool_where_it_takes_a_number(make, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()
