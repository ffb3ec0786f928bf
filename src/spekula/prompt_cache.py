"""Prompt caching: the last finished request's KV cache, kept for the next request that starts the same way.

A chat's next turn, an agent's next call or an edit session's second request re-sends everything said
so far, and a request that shares a system prompt with the last one starts with the same tokens. Their
prefill is most of what such a request costs on a CPU (docs/BENCHMARKS.md), and llama.cpp's server
(`cache_prompt`) and vLLM (automatic prefix caching) skip the part they have seen. One engine keeps
one finished sequence: a new request takes it when it shares at least `min_tokens` leading tokens with
the new prompt, cut back to what they share, and prefills only the rest; otherwise the kept sequence
is freed and the request opens a fresh one.

Where the runtime can share KV cells between sequences (llama.cpp's shared context, with the server's
continuous batching: Backend.share_prefix) a request still prefilling also borrows from the requests
running beside it: before each chunk, the longest prefix of its prompt that another live (or the kept)
sequence holds is shared into its cache instead of being computed, so an edit session's second turn
sent while the first still runs, or many requests with one system prompt, prefill it once.

What it keeps is this engine's own: a Pipeline's speculative and plain engines, and the
configurations of one `spekula bench` run, each cache their own requests, so neither gets a prefill
the other paid for. The kept positions hold what the runtime computed when it ran them (the prompt's
prefill, then one-token or verify passes), so on a runtime that is not block invariant (llama.cpp
without --exact) a near-tie in a later turn can come out as it would not after a fresh prefill, as
with llama.cpp's own prompt cache.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from spekula.backends.base import Backend, Sequence


def shared_prefix(a: Seq[int], b: Seq[int]) -> int:
    """How many leading tokens a and b have in common."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PromptCache:
    """One kept sequence per engine (enabled False: every request opens a fresh one)."""

    def __init__(self, backend: Backend, enabled: bool = True, min_tokens: int = 1) -> None:
        self.backend = backend
        self.enabled = enabled
        self.min_tokens = min_tokens
        self._kept: Sequence | None = None
        self._live: list[Sequence] = []  # sequences open() handed out whose requests still run
        self.hits = 0  # requests that started from the kept sequence
        self.reused_tokens = 0  # prompt tokens they did not prefill (kept or borrowed)

    def open(self, prefix: Seq[int]) -> Sequence:
        """A sequence for a request whose prompt, all but its last token, is `prefix`: the kept one cut back
        to the tokens it shares with prefix (its `length` says how many are already there), or a fresh one."""
        kept, self._kept = self._kept, None
        if kept is not None:
            shared = shared_prefix(kept.tokens, prefix)
            if shared >= self.min_tokens:
                kept.truncate(shared)
                self.hits += 1
                self.reused_tokens += shared
                self._live.append(kept)
                return kept
            kept.release()
        sequence = self.backend.new_sequence()
        self._live.append(sequence)
        return sequence

    def borrow(self, sequence: Sequence, prefix: Seq[int]) -> int:
        """Before a prefill chunk: share into `sequence` (which holds a prefix of `prefix`) the longest
        further part of `prefix` that another live sequence or the kept one holds, if the runtime can
        (Backend.share_prefix). Returns the tokens it gained (0: nothing to borrow)."""
        if not self.enabled or len(prefix) <= sequence.length:
            return 0
        sources = [s for s in [*self._live, self._kept] if s is not None and s is not sequence]
        best = max(sources, key=lambda s: shared_prefix(s.tokens, prefix), default=None)
        return 0 if best is None else self._borrow_from(best, sequence, prefix)

    def _borrow_from(self, source: Sequence, sequence: Sequence, prefix: Seq[int]) -> int:
        held = sequence.length
        shared = shared_prefix(source.tokens, prefix)
        if shared <= held or shared < self.min_tokens or not self.backend.share_prefix(source, sequence, shared):
            return 0
        self.reused_tokens += shared - held
        return shared - held

    def close(self, sequence: Sequence, reusable: bool) -> None:
        """A request is over: keep its sequence for the next one (releasing the one kept before), or free it.
        reusable False (the request failed: its cache may hold a pass that did not complete) frees it."""
        if sequence in self._live:
            self._live.remove(sequence)
        if not (self.enabled and reusable and sequence.length):
            sequence.release()
            return
        if self._kept is not None and self._kept is not sequence:
            self._kept.release()
        self._kept = sequence

    def clear(self) -> None:
        """Free the kept sequence's memory."""
        if self._kept is not None:
            self._kept.release()
            self._kept = None
