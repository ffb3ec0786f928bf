"""spekula.sampling.probabilities, the one function the draft and the target both call: the filters, and
temperatures so small that logits / T overflows (they are computed as their limit, never as NaN)."""

from __future__ import annotations

import pytest
import torch

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.proposers import DraftModelFactory, NgramFactory
from spekula.sampling import probabilities
from spekula.testing import random_table_backend

# Logits large enough that dividing by 1e-38 overflows float32 (any |x| > ~3.4); the best token is index 2.
LOGITS = torch.tensor([[4.0, -7.5, 9.25, 9.0, -float("inf")], [0.5, 30.0, -30.0, 29.0, 1.0]])  # [2, V=5]
TINY = [1e-38, 1e-45, 1e-300, 5e-324]  # float32 subnormals, then values that round to 0 in float32


@pytest.mark.parametrize("temperature", TINY)
def test_a_tiny_temperature_gives_the_limit_all_mass_on_the_argmax(temperature):
    assert not torch.isfinite(LOGITS / 1e-38).all()  # the naive division overflows: the case this guards
    p = probabilities(LOGITS, SamplingParams(temperature=temperature))
    assert torch.isfinite(p).all()
    assert torch.equal(p, torch.nn.functional.one_hot(LOGITS.argmax(-1), 5).float())


@pytest.mark.parametrize("temperature", TINY)
def test_tiny_temperature_with_every_filter_stays_a_distribution(temperature):
    params = SamplingParams(temperature=temperature, top_k=2, top_p=1e-300, min_p=0.5)
    p = probabilities(LOGITS, params)
    assert torch.equal(p, torch.nn.functional.one_hot(LOGITS.argmax(-1), 5).float())


def test_exact_ties_share_the_mass_evenly_at_a_tiny_temperature():
    tied = torch.tensor([3.0, 8.0, 8.0, -2.0])
    p = probabilities(tied, SamplingParams(temperature=1e-38))
    assert p.tolist() == [0.0, 0.5, 0.5, 0.0]


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 2.0])
def test_ordinary_temperatures_are_the_plain_softmax(temperature):
    p = probabilities(LOGITS, SamplingParams(temperature=temperature))
    assert torch.allclose(p, torch.softmax(LOGITS / temperature, dim=-1), rtol=1e-5, atol=1e-7)


def test_top_p_below_float32_resolution_keeps_the_most_likely_token():
    """top_p 1e-320 is 0 in float32; the token that crosses the threshold (the first) is still kept."""
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=1e-320))
    assert torch.equal(p, torch.nn.functional.one_hot(LOGITS.argmax(-1), 5).float())


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_speculative_decoding_at_a_tiny_temperature_equals_greedy_decoding(proposer):
    """The limit holds through the whole loop, for the draft's q and the target's p alike (one function)."""
    target = random_table_backend(40, seed=0, order=2)  # random float logits: no exact ties
    draft = random_table_backend(40, seed=5, order=2)
    factory = DraftModelFactory(draft) if proposer == "draft" else NgramFactory(4, 1)
    stop = StopConfig(max_tokens=30)
    greedy = Engine(target).generate([1, 2, 3], SamplingParams(), stop).run().token_ids
    for temperature in (1e-38, 5e-324):
        sampling = SamplingParams(temperature=temperature, seed=7)
        spec = Engine(target, factory, SpecConfig(k=4)).generate([1, 2, 3], sampling, stop).run()
        assert spec.token_ids == greedy
        assert spec.stats.drafted > 0
