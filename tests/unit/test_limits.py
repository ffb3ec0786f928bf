"""spekula.limits: the one validator of prompts and forwards, used by the engine, the server and the backends."""

from __future__ import annotations

import pytest

from spekula.errors import ConfigError
from spekula.limits import (
    ContextExceeded,
    EmptyPrompt,
    LimitError,
    OutOfVocabulary,
    check_forward,
    check_prompt,
    check_token_ids,
)

VOCAB, CONTEXT = 10, 8


@pytest.mark.parametrize(
    "prompt, error, message",
    [
        ([], EmptyPrompt, "the prompt is empty: give at least one token"),
        ([1, 10, 2], OutOfVocabulary, r"prompt token ids \[10\] are outside the vocabulary \[0, 10\)"),
        ([-1, 3], OutOfVocabulary, r"\[-1\] are outside the vocabulary"),
        (list(range(10, 20)), OutOfVocabulary, r"\[10, 11, 12, 13, 14\] are outside"),  # the first five only
        ([1] * CONTEXT, ContextExceeded, "the prompt has 8 tokens but the model's context holds 8 .*shorten the"),
        ([1, 99] * CONTEXT, OutOfVocabulary, "outside the vocabulary"),  # a bad id is named before the length
    ],
)
def test_check_prompt_refuses_with_a_message_that_says_what_to_change(prompt, error, message):
    with pytest.raises(error, match=message) as caught:
        check_prompt(prompt, VOCAB, CONTEXT)
    assert isinstance(caught.value, LimitError) and isinstance(caught.value, ConfigError)


@pytest.mark.parametrize("prompt", [[0], [9], list(range(7)), [0] * (CONTEXT - 1)])
def test_check_prompt_accepts_a_prompt_that_leaves_room_for_one_output_token(prompt):
    check_prompt(prompt, VOCAB, CONTEXT)


def test_check_prompt_takes_any_sequence_of_ints():
    check_prompt((1, 2, 3), VOCAB, CONTEXT)
    with pytest.raises(EmptyPrompt):
        check_prompt((), VOCAB, CONTEXT)


def test_check_token_ids_names_what_it_checks():
    check_token_ids([0, 5, 9], VOCAB)
    check_token_ids([], VOCAB)
    with pytest.raises(OutOfVocabulary, match=r"^draft ids \[12\] are outside the vocabulary \[0, 10\); use ids from"):
        check_token_ids([3, 12], VOCAB, what="draft ids")


@pytest.mark.parametrize(
    "length, new, ok",
    [(0, 1, True), (0, CONTEXT, True), (5, 3, True), (5, 4, False), (CONTEXT, 1, False), (0, CONTEXT + 1, False)],
)
def test_check_forward_allows_exactly_the_context(length, new, ok):
    if ok:
        check_forward(length, new, CONTEXT)
    else:
        with pytest.raises(ContextExceeded, match=f"sequence of {length + new} tokens exceeds the model's context of "):
            check_forward(length, new, CONTEXT)


def test_an_empty_forward_is_a_callers_bug_not_a_config_error():
    with pytest.raises(ValueError, match="forward needs at least one token") as caught:
        check_forward(3, 0, CONTEXT)
    assert not isinstance(caught.value, ConfigError)
