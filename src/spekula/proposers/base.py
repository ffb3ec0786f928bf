"""What every proposer offers the engine: a block of candidate tokens, and a way to learn the outcome.

A Proposer serves ONE request (it may hold that request's draft KV cache); a ProposerFactory holds
what requests share (a loaded draft model) and makes a Proposer per request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from spekula.config import SamplingParams
from spekula.draft_class import DraftClass
from spekula.noise import PositionalNoise
from spekula.verify import Verdict


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # [k'] with k' <= k: a proposer may offer fewer tokens than asked
    probs: torch.Tensor | None = None  # [k', V] q at each drafted position; None = deterministic (one-hot q)

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft([])


class Proposer(ABC):
    # Drafting costs nothing worth measuring and uses no random numbers (a lookup in the context, not a
    # model): at a plain step the engine may ask for the draft it would have made and score it against
    # the tokens the target emits next (spekula.shadow), so the controller learns classes it would not pay
    # to try.
    free_to_draft: bool = False

    @abstractmethod
    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionalNoise | None) -> Draft:
        """Up to k tokens that might follow `context` (every committed token: prompt + output).

        noise: the request's uniform numbers seen from the first drafted position (noise.uniform(i) belongs to
        the i-th drafted token), for a proposer that samples its draft: drawing token i with
        spekula.noise.draw(q_i, noise.uniform(i)) couples it to the target's own draw there, which is what
        verification accepts (spekula.verify.verify_positional). None when nothing may be sampled (a shadow
        draft); lookup proposers ignore it."""

    def observe(self, context: list[int], verdict: Verdict) -> None:
        """Called after each step with the new committed context. Default: nothing to learn."""

    def draft_class(self, context: list[int]) -> DraftClass | None:
        """What the proposer knows, before drafting, of how promising its next draft is: the class
        under which the controller learns acceptance apart (spekula.draft_class; n-gram lookup: the
        matched length, "4-gram" ... "1-gram"; NO_DRAFT: nothing to offer). Default None: no such knowledge."""
        return None

    def draft_length(self, context: list[int]) -> int | None:
        """The most tokens the next draft can hold, known before drafting (a lookup's continuation is only so
        long: the controller prices the pass that draft makes, not a wider one it cannot fill). Default None:
        as many as asked."""
        return None

    def catch_up(self, context: list[int]) -> int:
        """Tokens of `context` the proposer would have to process before it can draft (a draft model
        that has not seen the prompt yet). Default: none."""
        return 0

    def close(self) -> None:
        """Free per-request resources (a draft KV cache)."""


class ProposerFactory(ABC):
    name: str  # the registry name, shown in stats and traces

    @property
    def draft_backend(self):
        """The draft model, for proposers that run one (the cost model times it); else None."""
        return None

    @abstractmethod
    def create(self, namespace: str = "") -> Proposer:
        """A proposer for one request. namespace: whose text the request may draft from, for a factory
        that remembers earlier requests (the suffix proposer's cache; the server passes a hash of the
        API key): a request never drafts another namespace's text. Factories without memory ignore it."""

    def forget(self, namespace: str) -> None:
        """Drop what the factory remembers of `namespace`'s requests (bench: one repeat's outputs
        before the next). Default: nothing is remembered."""

    def describe(self) -> dict:
        return {"proposer": self.name}
