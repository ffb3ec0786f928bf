"""Prompt caching: finished requests' KV caches, kept for the next request that starts the same way.

A chat's next turn, an agent's next call or an edit session's second request re-sends everything said
so far, and a request that shares a system prompt with the last one starts with the same tokens. Their
prefill is much of what such a request costs on a CPU (docs/BENCHMARKS.md, "The server: spekula serve
against llama_cpp.server": TTFT against latency), and llama.cpp's server (`cache_prompt`) and vLLM
(automatic prefix caching) skip the part they have seen. An engine keeps up to `max_kept` finished
sequences, the most recently finished last: a new request takes the one that shares the most leading tokens with
its prompt (at least `min_tokens`), cut back to what they share, and prefills only the rest; otherwise it opens a
fresh one. One is enough for one client; a server with several clients keeps more (llama.cpp's shared context: as
many as it has sequence ids to spare), or the second turn of one conversation finds its first turn's cache gone,
replaced by whichever other request finished in between. Where the runtime's sequences come from a bounded pool
(Backend.spare_sequences), the oldest kept ones are freed when a new request needs the room.

Where the runtime can park a sequence (Sequence.park: llama.cpp's shared context), a kept sequence is
parked as it is kept: its cache moves to host memory, its cells and sequence id are freed, so the
requests that run on do not pay for reading past it in every pass, and the pool always has room. A
request that wants it gets a new sequence with the cache copied back (Sequence.restore_into), cut to
what they share; the parked copy is kept while it holds tokens the request does not share (a later
request may want them), and dropped when the request holds all of it (its own cache, kept when it
finishes, supersedes it). Memory: a parked copy holds the cache's bytes (llama.cpp: what its KV cells
hold, K and V of every layer per token), at most max_kept of them.

Where the runtime can share KV cells between sequences (llama.cpp's context of several sequences, with the
server's continuous batching: Backend.share_prefix) a request still prefilling also borrows from the requests
running beside it: before each chunk, the longest prefix of its prompt that another live (or a kept)
sequence holds is shared into its cache instead of being computed, so an edit session's second turn
sent while the first still runs, or many requests with one system prompt, prefill it once. In llama.cpp's
exact mode, whose KV streams cannot share cells, the cells are copied (as a parked cache is restored): a
memory copy of the K and V of the tokens, not a pass over them.

What it keeps is this engine's own: a Pipeline's speculative and plain engines, and the
configurations of one `spekula bench` run, each cache their own requests, so neither gets a prefill
the other paid for. The kept positions hold what the runtime computed when it ran them (the prompt's
prefill, then one-token or verify passes). Where a row's bits depend on the kind of pass that computed it
(llama.cpp's exact mode: a prompt's pass of 64 rows or more, one of 32 or more, a step's;
Capabilities.pass_kind_widths), a request takes only rows that a fresh prefill of its own prompt would compute
alike (_reusable), so its text does not depend on which request came before it: llama.cpp's `cache_prompt` reuses
any row, and a short prompt after a long one that shares its system prompt can answer otherwise than on a fresh
server (scripts/experiments/prompt_cache_history.py; docs/decisions/0018-history-exact-prompt-cache.md). On a
runtime that is not block invariant (llama.cpp without --exact) a near-tie in a later turn can still come out as it
would not after a fresh prefill, as with llama.cpp's own prompt cache.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from spekula.backends.base import Backend, Sequence
from spekula.prefill_plan import PrefillPlan, TurnMarkers


def shared_prefix(a: Seq[int], b: Seq[int]) -> int:
    """How many leading tokens a and b have in common (compared a block at a time: a server asks this
    of every pair of prompts it is prefilling, thousands of tokens each, at every round)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i : i + 64] == b[i : i + 64]:
        i += 64
    while i < n and a[i] == b[i]:  # the first difference (or the shorter one's end) is in this block
        i += 1
    return min(i, n)


class PromptCache:
    """Up to max_kept finished sequences per engine (enabled False: every request opens a fresh one)."""

    def __init__(
        self,
        backend: Backend,
        enabled: bool = True,
        min_tokens: int = 1,
        max_kept: int = 1,
        any_rows: bool = False,
        markers: TurnMarkers | None = None,
    ) -> None:
        """any_rows: take every row a prompt shares, whatever pass computed it (llama.cpp's cache_prompt; _reusable).
        markers: where a prompt's assistant messages lie (the chat template's), which a fresh prefill computes as a
        step's rows (plan()) so that a next turn takes its last answer's."""
        if max_kept < 1:
            raise ValueError(f"max_kept must be >= 1, got {max_kept}")
        self.backend = backend
        self.enabled = enabled
        self.min_tokens = min_tokens
        self.max_kept = max_kept
        self.any_rows = any_rows
        self.markers = markers
        self._kept: list[Sequence] = []  # finished requests' sequences, the most recently finished last
        self._live: list[Sequence] = []  # sequences open() handed out whose requests still run
        self.hits = 0  # requests that started from the kept sequence
        self.reused_tokens = 0  # prompt tokens they did not prefill (kept or borrowed)
        self.restores = 0  # of the hits, those copied back from a parked sequence

    def open(self, prefix: Seq[int]) -> Sequence:
        """A sequence for a request whose prompt, all but its last token, is `prefix`: the kept one that
        shares most with prefix (a parked one: a new sequence holding its cache), cut back to what they
        share (its `length` says how many tokens are already there), or a fresh one."""
        plan = self.plan(prefix)
        shares = [self._reusable(kept, prefix, plan) for kept in self._kept]
        best = max(reversed(range(len(shares))), key=shares.__getitem__, default=None)  # ties: the latest
        # Where the runtime shares cells between sequences, a fresh sequence borrows the shared part
        # (borrow(), before the first chunk) and the kept one stays whole for a request that shares more
        # (a short prompt that shares only the system prompt would otherwise cut a long conversation's
        # cache back to it). With the pool full, the oldest other kept sequence makes room for that; the
        # kept one is taken only when it is the only one. (Taking the latest kept one whenever the pool
        # was full cut an edit session's first turn back to the system prompt when a short request came
        # in just after it finished, and its second turn prefilled its whole prompt again.)
        useful = best is not None and shares[best] >= self.min_tokens
        if best is not None and useful and self._kept[best].parked:
            return self._restore(self._kept[best], shares[best])
        shares_cells = self.backend.capabilities.shares_prefix
        if useful and shares_cells and self.backend.spare_sequences() == 0:
            others = [i for i in self._resident() if i != best]
            if others:
                self._kept.pop(others[0]).release()
        borrows = shares_cells and self.backend.spare_sequences() != 0
        if useful and not borrows:
            assert best is not None  # useful says so
            kept = self._kept.pop(best)
            kept.truncate(shares[best])
            self.hits += 1
            self.reused_tokens += shares[best]
            self._live.append(kept)
            return kept
        # the oldest kept ones make room: in the runtime's pool, and (nothing kept is of use to this
        # request) in memory, as one kept sequence is freed when an unrelated prompt arrives
        self._free_room()
        while self._kept and not useful and len(self._kept) >= self.max_kept:
            self._kept.pop(0).release()
        sequence = self.backend.new_sequence()
        self._live.append(sequence)
        return sequence

    def _reusable(self, source: Sequence, prefix: Seq[int], plan: PrefillPlan) -> int:
        """How many of prefix's leading tokens (`plan`: its prefill's, plan()) a request may take from `source`,
        counted from the first (a borrow may copy them all over the rows the request holds: borrow()): those they
        share, and where the runtime's rows hold other bits after passes of other kinds
        (Capabilities.pass_kind_widths), only as many as a fresh prefill of the prompt would compute alike
        (PrefillPlan.reusable): a taken row must have been computed by a pass of the kind the plan computes it in,
        and the rows left must still make passes of their kinds. A narrow prompt that follows a wide one then
        computes the rows they share again; a conversation's next turn takes its last answer (a step's rows), which
        the plan computes as a step's where the chat template's markers find it (plan())."""
        shared = shared_prefix(source.tokens, prefix)
        kinds = source.pass_kinds
        if self.any_rows or not self.backend.capabilities.pass_kind_widths or kinds is None or not shared:
            return shared
        return plan.reusable(kinds, shared)

    def plan(self, prefix: Seq[int]) -> PrefillPlan:
        """How a fresh prefill of a prompt whose prefix (all but its last token) is `prefix` computes its rows
        (spekula.prefill_plan): Generation.prefill_chunk chunks the prompt by it, _reusable takes rows by it. Where
        rows hold the same bits whatever pass computed them, or any row is taken, one wide segment. (Not whether this
        cache is enabled: a prompt's rows, and so its text, are the same with it or without.)"""
        capabilities = self.backend.capabilities
        markers = self.markers if capabilities.pass_kind_widths and not self.any_rows else None
        return PrefillPlan.of(prefix, capabilities.pass_kind_widths, capabilities.prefill_min_rows, markers)

    def _resident(self) -> list[int]:
        """The kept sequences that hold cells in the runtime (not parked), oldest first, by index."""
        return [i for i, kept in enumerate(self._kept) if not kept.parked]

    def _free_room(self) -> None:
        """With the runtime's pool full, free the oldest resident kept sequences until it has room."""
        while self.backend.spare_sequences() == 0 and (resident := self._resident()):
            self._kept.pop(resident[0]).release()

    def _restore(self, parked: Sequence, shared: int) -> Sequence:
        """A new sequence for a request that shares `shared` tokens with a parked kept sequence: its cache
        copied back and cut to them (a fresh one where the runtime cannot: the request prefills it all)."""
        self._free_room()
        sequence = self.backend.new_sequence()
        self._live.append(sequence)
        if not parked.restore_into(sequence):
            return sequence
        sequence.truncate(shared)
        self.hits += 1
        self.restores += 1
        self.reused_tokens += shared
        if shared == parked.length:  # the request holds all of it: its own cache will supersede it
            self._kept.remove(parked)
            parked.release()
        return sequence

    def borrow(self, sequence: Sequence, prefix: Seq[int]) -> int:
        """Before a prefill chunk: share into `sequence` (which holds a prefix of `prefix`) the longest
        further part of `prefix` that another live sequence or the kept one holds, if the runtime can
        (Backend.share_prefix). Returns the tokens it gained (0: nothing to borrow)."""
        if not self.enabled or len(prefix) <= sequence.length:
            return 0
        sources = [s for s in [*self._live, *self._kept] if s is not sequence and not s.parked]
        plan = self.plan(prefix)
        # every row from the first (_reusable), those the sequence holds included: a runtime may copy them all over
        # its own (llama.cpp's exact mode), and they must be rows a fresh prefill computes alike too
        shares = [(self._reusable(s, prefix, plan), s) for s in sources]
        shared, best = max(shares, key=lambda share: share[0], default=(0, None))
        return 0 if best is None else self._borrow_from(best, sequence, shared)

    def _borrow_from(self, source: Sequence, sequence: Sequence, shared: int) -> int:
        """Share source's first `shared` tokens (_reusable's) into `sequence`; the tokens it gained."""
        held = sequence.length
        if shared <= held or shared < self.min_tokens or not self.backend.share_prefix(source, sequence, shared):
            return 0
        self.reused_tokens += shared - held
        return shared - held

    def close(self, sequence: Sequence, reusable: bool) -> None:
        """A request is over: keep its sequence for the next ones (freeing the oldest kept past max_kept),
        or free it. reusable False (the request failed: its cache may hold a pass that did not complete)
        frees it."""
        if sequence in self._live:
            self._live.remove(sequence)
        if not (self.enabled and reusable and sequence.length):
            sequence.release()
            return
        if sequence not in self._kept:
            self._kept.append(sequence)
        while len(self._kept) > self.max_kept:
            self._kept.pop(0).release()
        if sequence in self._kept:
            sequence.park()  # where the runtime can: off the shared pool, into host memory

    def clear(self) -> None:
        """Free the kept sequences' memory."""
        while self._kept:
            self._kept.pop().release()
