"""What a model can take: token ids inside its vocabulary, sequences inside its context.

The one place these checks live. The engine checks a request's prompt before it starts, the server
checks it before the request is queued (and answers each kind of refusal with its own HTTP status),
and every backend checks each forward. Token ids only: nothing here knows about text.
"""

from __future__ import annotations

from collections.abc import Sequence

from spekula.errors import ConfigError


class LimitError(ConfigError):
    """Token ids a model cannot take; the subclass says which limit."""


class EmptyPrompt(LimitError):
    pass


class OutOfVocabulary(LimitError):
    pass


class ContextExceeded(LimitError):
    pass


def check_prompt(prompt_ids: Sequence[int], vocab_size: int, context_length: int) -> None:
    """A prompt the model can start from: at least one token, every id in the vocabulary, and room
    left in the context for at least one output token."""
    if len(prompt_ids) == 0:
        raise EmptyPrompt("the prompt is empty: give at least one token")
    check_token_ids(prompt_ids, vocab_size, what="prompt token ids")
    if len(prompt_ids) >= context_length:
        raise ContextExceeded(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds {context_length} "
            "(prompt and output together); shorten the prompt"
        )


def check_token_ids(token_ids: Sequence[int], vocab_size: int, what: str = "token ids") -> None:
    """Every id in [0, vocab_size)."""
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise OutOfVocabulary(
            f"{what} {bad[:5]} are outside the vocabulary [0, {vocab_size}); use ids from this model's tokenizer"
        )


def check_forward(length: int, new_tokens: int, context_length: int) -> None:
    """A forward that appends new_tokens to a sequence of `length` tokens: at least one, and the
    sequence still inside the context."""
    if new_tokens == 0:
        raise ValueError("forward needs at least one token")  # a caller's bug, not a user's input
    if length + new_tokens > context_length:
        raise ContextExceeded(
            f"sequence of {length + new_tokens} tokens exceeds the model's context of {context_length}; "
            "shorten the prompt or lower max_tokens"
        )
