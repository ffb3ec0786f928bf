"""n-gram prompt lookup (Saxena 2023; transformers' prompt_lookup_num_tokens, vLLM's ngram).

Match the last n committed tokens, n from ngram_max down to ngram_min, against every earlier place
in prompt + output; propose the tokens that followed the most recent match. No model, no q: the
verifier treats the draft as one-hot. Cheap enough to run every step, and strong wherever the
output copies its input (code edits, extraction, quoting).

The length of the matched suffix is the draft's class (draft_class, "4-gram" ... "1-gram"): a draft after
a 4-token match is accepted far more often than one after a 1-token match (`scripts/experiments/ngram_replay.py
RESULTS --by-class --draft ngram` measures it on a bench run's greedy outputs), and the controller learns
each class's rate apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from spekula.config import SamplingParams
from spekula.draft_class import NO_DRAFT, DraftClass, ngram_class
from spekula.noise import PositionalNoise
from spekula.proposers.base import EMPTY_DRAFT, Draft, Proposer, ProposerFactory


class NgramProposer(Proposer):
    free_to_draft = True  # a dictionary lookup (spekula.shadow)

    def __init__(self, ngram_max: int, ngram_min: int) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        # For each n: n-gram -> start of the tokens that followed its most recent occurrence.
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(ngram_min, ngram_max + 1)}
        self._indexed: list[int] = []  # the context the index covers (committed tokens only grow)

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionalNoise | None) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        match = self._match(context)
        if match is None:
            return EMPTY_DRAFT
        start = match[1]
        return Draft(context[start : start + k])

    def draft_class(self, context: list[int]) -> DraftClass:
        match = self._match(context)
        return NO_DRAFT if match is None else ngram_class(match[0])

    def draft_length(self, context: list[int]) -> int:
        match = self._match(context)
        return 0 if match is None else len(context) - match[1]

    def _match(self, context: list[int]) -> tuple[int, int] | None:
        """(n, start): the longest suffix of n tokens seen before, and where what followed it starts."""
        self._update_index(context)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(context) <= n:
                continue
            start = self._index[n].get(tuple(context[-n:]))
            if start is not None:
                return n, start
        return None

    def _update_index(self, context: list[int]) -> None:
        done = len(self._indexed)
        if context[:done] != self._indexed:  # not an extension: start over (never happens in the engine)
            self._index = {n: {} for n in self._index}
            done = 0
        # An n-gram ending at `end` is indexed once a token follows it (end < len(context)).
        for end in range(max(done, 1), len(context)):
            for n, table in self._index.items():
                if end >= n:
                    table[tuple(context[end - n : end])] = end
        self._indexed = list(context)


@dataclass
class NgramFactory(ProposerFactory):
    ngram_max: int = 4
    ngram_min: int = 1
    name: str = "ngram"

    def create(self, namespace: str = "") -> NgramProposer:  # no memory across requests: namespace unused
        return NgramProposer(self.ngram_max, self.ngram_min)

    def describe(self) -> dict:
        return {"proposer": self.name, "ngram_max": self.ngram_max, "ngram_min": self.ngram_min}
