"""A smaller model of the same vocabulary drafts k tokens autoregressively.

Its KV cache is reused across steps by longest common prefix with the committed context (as
llama.cpp does): after a step the cache is truncated to what was committed, so the next proposal
feeds only the tokens the draft has not seen (the recovered or bonus token, and at most one accepted
draft token it never ran). The draft is never prefilled from scratch after the first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spekula.backends.base import Backend, Sequence
from spekula.config import SamplingParams
from spekula.noise import PositionalNoise, draw
from spekula.prompt_cache import shared_prefix
from spekula.proposers.base import EMPTY_DRAFT, Draft, Proposer, ProposerFactory
from spekula.sampling import greedy_token, probabilities
from spekula.verify import Verdict


class DraftModelProposer(Proposer):
    """The draft's sequence (its KV cache) opens at the first proposal: a request that never drafts
    (k = 0 throughout, e.g. a large batch on a CPU) costs the draft nothing, not even a context.

    confidence: stop drafting after the first token the draft itself gives less than this
    probability (that token is still proposed; its verification costs one row of a pass, its
    drafting is already paid). Fewer than k tokens then go to the target. Lossless in both modes:
    the verifier emits the target's own draw at every position whatever was drafted (spekula.verify).

    A sampled draft token i is draw(q_i, u_i) with the request's uniform for its output position, the
    one the target's draw there uses: the draft is accepted where the two draws agree (spekula.verify
    says what that costs against rejection sampling's min(1, p/q))."""

    def __init__(self, backend: Backend, confidence: float | None = None) -> None:
        self.backend = backend
        self.confidence = confidence
        self._sequence: Sequence | None = None

    @property
    def sequence(self) -> Sequence:
        if self._sequence is None:
            self._sequence = self.backend.new_sequence()
        return self._sequence

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionalNoise | None) -> Draft:
        if noise is None and not sampling.greedy:
            raise ValueError("a sampled draft needs the request's noise (Proposer.propose), got None")
        if k <= 0:
            return EMPTY_DRAFT
        k = min(k, self.sequence.context_length - len(context))
        if k <= 0:
            return EMPTY_DRAFT
        keep = min(shared_prefix(self.sequence.tokens, context), len(context) - 1)  # feed >= 1 token
        self.sequence.truncate(keep)
        logits = self.sequence.forward(context[keep:], num_logits=1)[-1]  # [V]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            q = probabilities(logits, sampling)  # [V]
            # sampled: noise is not None (checked above)
            token = int(greedy_token(logits)) if sampling.greedy else draw(q, noise.uniform(i))  # type: ignore[union-attr]
            tokens.append(token)
            probs.append(q)
            if self.confidence is not None and float(q[token]) < self.confidence:
                break
            if i + 1 < k:
                logits = self.sequence.forward([token], num_logits=1)[-1]
        return Draft(tokens, torch.stack(probs))  # q: [k, V]

    def catch_up(self, context: list[int]) -> int:
        seen = shared_prefix(self._sequence.tokens, context) if self._sequence is not None else 0
        return max(len(context) - seen - 1, 0)  # the last token is fed with the draft's first step anyway

    def observe(self, context: list[int], verdict: Verdict) -> None:
        # Roll back to exactly the committed state: rejected draft tokens leave the cache.
        if self._sequence is not None:
            self._sequence.truncate(shared_prefix(self._sequence.tokens, context))

    def close(self) -> None:
        if self._sequence is not None:
            self._sequence.release()


@dataclass
class DraftModelFactory(ProposerFactory):
    backend: Backend
    name: str = "draft-model"
    confidence: float | None = None  # see DraftModelProposer

    def create(self, namespace: str = "") -> DraftModelProposer:  # no memory across requests: namespace unused
        return DraftModelProposer(self.backend, self.confidence)

    @property
    def draft_backend(self) -> Backend:
        return self.backend

    def describe(self) -> dict:
        return {"proposer": self.name, "draft": self.backend.name, "draft_confidence": self.confidence}
