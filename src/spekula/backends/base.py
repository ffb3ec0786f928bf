"""The one protocol every runtime implements.

A Backend is a loaded model. A Sequence is one sequence's KV cache in that model: it knows which
token ids it holds (`tokens`), appends new ones with `forward` (one pass, logits back for the last
positions) and rolls back with `truncate`. Speculative decoding needs nothing else: the verifier
scores k + 1 tokens in one `forward`, then `truncate` drops what was rejected.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from spekula.limits import check_forward


@dataclass(frozen=True)
class Capabilities:
    batching: bool = False  # can run several sequences in one forward
    tree_mask: bool = False  # accepts an attention mask over the verified block (token trees)
    # A token's logits do not depend on how many tokens share its pass (up to fp32 rounding). False
    # for llama.cpp, whose kernels for several tokens differ from those for one: greedy speculative
    # output can then differ from plain decoding where the target's top two logits nearly tie.
    block_invariant: bool = True
    shares_prefix: bool = False  # share_prefix gives a sequence another's cached prefix without computing it
    # Sequence.park moves a kept sequence's cache into host memory, freeing what it held in the runtime (its cells
    # and sequence id, or its context): a server can keep several finished conversations at little cost
    parks: bool = False
    # A prompt's prefill chunks go through Sequence.prefill, in passes of their own, never beside other sequences'
    # rows: in llama.cpp's exact mode a pass's kernels depend on its rows, so a chunk batched with others would
    # hold other bits than the same chunk alone (a batching server then batches its steps only)
    prefill_alone: bool = False
    # A batched pass runs as passes that each take as many rows of every sequence in them (llama.cpp's KV streams in
    # exact mode), so sequences with other row counts cost a pass each: the pass's cost is not that of its total
    # rows, and a batching server prices a round as one pass of the first rows plus one per draft (best_ks_ragged)
    equal_rows_per_pass: bool = False
    # A prompt's rows hold the same bits however the prompt was chunked only where every prefill pass has at least
    # this many rows (llama.cpp's exact mode: below it other kernels take them); a prompt with fewer rows left goes in
    # one pass. Generation.prefill_chunk sizes chunks by it. 1: any chunking.
    prefill_min_rows: int = 1
    # The pass that finishes a prompt (its last chunk folded into the first step) runs the prompt's rows and its last
    # token in calls of their own, as a prefill, and a draft's rows after them in another (llama.cpp's exact mode):
    # a draft there costs a pass of its own rows, not what they add to the step's pass (AdaptiveK prices it so)
    prompt_pass_apart: bool = False
    # A row's bits depend on the width of the pass that computed it, in classes (kinds): a pass of w rows is of kind
    # pass_kind(w), how many of these widths it reaches (llama.cpp's exact mode: a verified block's widest, ggml's
    # tiled matmul from 32 rows, flash attention's tiled kernel from 64; Sequence.pass_kinds records them). A prompt
    # cache reuses a kept row only where a fresh prefill of the new prompt would compute it in a pass of its kind
    # (spekula.prompt_cache), so a request's text does not depend on the request before it. (): one kind.
    pass_kind_widths: tuple[int, ...] = ()


def pass_kind(rows: int, widths: Seq[int]) -> int:
    """The kind of a pass of `rows` rows: how many of `widths` (Capabilities.pass_kind_widths) it reaches."""
    return sum(rows >= width for width in widths)


class Sequence(ABC):
    """One sequence's KV cache. Invariant: the cache holds keys and values for exactly `tokens`."""

    def __init__(self, context_length: int) -> None:
        self.tokens: list[int] = []
        self.context_length = context_length

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def pass_kinds(self) -> Seq[int] | None:
        """Per held token, the kind of the pass that computed its row (Capabilities.pass_kind_widths); None where the
        runtime does not record them (its rows hold the same bits whatever pass computed them, or it has one kind)."""
        return None

    def forward(self, token_ids: Seq[int], num_logits: int | None = None) -> torch.Tensor:
        """Append token_ids at positions length .. length + S - 1 in one pass.

        Returns float32 logits [num_logits, V] for the last num_logits positions (all S if None).
        """
        check_forward(self.length, len(token_ids), self.context_length)
        num_logits = len(token_ids) if num_logits is None else num_logits
        logits = self._forward(list(token_ids), num_logits)
        self.tokens.extend(int(t) for t in token_ids)
        return logits

    def prefill(self, token_ids: Seq[int], narrow: bool = False) -> None:
        """Append prompt tokens whose logits nobody reads (a prefill chunk: the first step feeds the pending
        last token). A runtime may shape its passes for that (llama.cpp's exact mode: LlamaCppSequence); narrow:
        in passes of a step's kind (an assistant's message in the history: spekula.prefill_plan), where it has
        kinds (Capabilities.pass_kind_widths)."""
        if token_ids:
            self.forward(token_ids, num_logits=1)

    def truncate(self, length: int) -> None:
        """Forget every token from position `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        if length < self.length:
            self._truncate(length)
            del self.tokens[length:]

    def release(self) -> None:
        """Free the cache's memory; the sequence is empty afterwards."""
        self.truncate(0)

    # A kept (finished) sequence may be parked: its cache moved out of the runtime into host memory (so
    # that a shared pool's passes no longer read past its cells, and a context of its own goes back to the
    # runtime's pool), and copied back into a new sequence when a request wants it (PromptCache). Runtimes
    # that cannot (Capabilities.parks False) keep it in place.
    parked = False  # parked: forward and truncate refuse; restore_into and release are what is left

    def park(self) -> bool:
        """Move this sequence's cache into host memory (what it held in the runtime freed, `tokens` kept);
        False: nothing done, the sequence stays as it is (the default)."""
        return False

    def restore_into(self, target: Sequence) -> bool:
        """A parked sequence: give the empty `target` (of the same backend) its cache and tokens, and stay
        parked (a snapshot: it can be restored again). False: nothing done, target still empty."""
        return False

    @abstractmethod
    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor: ...

    @abstractmethod
    def _truncate(self, length: int) -> None: ...


class Backend(ABC):
    """A loaded model that can open sequences."""

    name: str
    vocab_size: int  # width of the logits
    context_length: int
    eos_token_ids: frozenset[int]
    capabilities: Capabilities = Capabilities()

    @abstractmethod
    def new_sequence(self) -> Sequence: ...

    def single_pass_width(self) -> int | None:
        """The widest block Sequence.forward scores in ONE pass; a wider block is scored in several, one
        after another (llama.cpp in exact mode). None: any width."""
        return None

    def spare_sequences(self) -> int | None:
        """How many more sequences new_sequence() can open in the pass-sharing pool (llama.cpp: sequence
        ids of the shared context left); None: no such bound (each sequence is memory of its own)."""
        return None

    def share_prefix(self, source: Sequence, target: Sequence, length: int) -> bool:
        """Give `target` the cache of source's first `length` tokens without computing them again:
        target holds a prefix of source's tokens, shorter than length, and afterwards holds
        source.tokens[:length]. False (nothing done) where the runtime cannot share (the default)."""
        return False

    def describe(self) -> dict:
        return {"backend": type(self).__name__, "name": self.name, "vocab_size": self.vocab_size}
