"""llama.cpp as a runtime, through llama-cpp-python (GGUF models, quantised kernels).

One model per backend. A sequence is a sequence id in a llama.cpp context: with `parallel` > 1
(BackendConfig.parallel; the server asks for one per running request) the first `parallel`
sequences share ONE context, so `forward_batch` scores every running request's block in one
llama_decode (continuous batching, as llama-server's slots do: on a compute-bound CPU a pass over
several rows costs far less than as many one-row passes). Any further sequence, and every sequence
when parallel is 1, gets a context of its own from a pool. `forward` is one llama_decode over the
block with logits requested for the last num_logits positions only (a long prefill does not pay the
output layer for every prompt token); `truncate` removes the sequence's KV cells from the cut on
(llama.cpp's memory_seq_rm) and moves the position, so rollback costs nothing. A finished sequence of the
shared context that the prompt cache keeps is parked (`park`): its cells copied to host memory and freed, so
the others' passes do not read past them, and copied back into a new sequence (`restore_into`) for a request
that wants them.

Exact mode (BackendConfig.exact) makes a token's logits independent of how many tokens share its pass,
bit for bit, so greedy speculative output equals plain decoding in the same mode. The causes of difference
are closed:
- weights: the build patches llama.cpp (patches/llamacpp/, applied by spekula.llamacpp_build) so that its
  repacked Q4_K kernel sums a row of a 4-row group in the order it sums a row alone, Q6_K is repacked too on x86
  with AVX2, in kernels that sum a row alike alone or in a group (patch 0006, docs/decisions/0016-q6_K-repacked-
  on-x86.md; their 512-bit and 256-bit forms compute the same bits, and the load takes the faster for each run of
  rows: llamacpp_forms, patch 0009), with AVX2 (AVX-512 VNNI or not) a Q4_K product of two rows or more goes
  through a kernel that sums a row as the one-row kernel does (patch 0008, docs/decisions/0017-q4_K-vnni-all-rows.md,
  0025-q4_K-avx2-all-rows.md), and ggml's
  tiled K-quant kernel (another summation order; weights not repacked) takes over only from 32 rows, past any
  verified block;
- attention: a verified block's rows and a one-token pass must sum attention alike. On the project's build two ways
  do, K and V in F16 (llama.cpp's default types) and a prompt's passes of TILED_ATTENTION_ROWS or more in flash
  attention's tiled kernel: (patches 0004 and 0005) attention as matmuls in every narrower pass (llamafile's tinyBLAS
  sums each row of a pass of any width the same way, one row included; V stored transposed), whose verified blocks
  over a long context cost less than flash attention's one-row kernel, which scores each row alone (docs/decisions/
  0013-exact-attention-without-flash.md); and (patch 0003) flash attention in every pass, whose one-token pass costs
  less on some CPUs (docs/decisions/0014-attention-way-by-measurement.md). `_exact_attentions` lists
  the ways in order of preference; `_check_exact` takes the first that its load-time checks find exact, unless the
  first exact one whose one-token passes take the other kernel costs less a one-token pass in those checks, by more
  than WAY_MARGIN. Patch 0003 takes ggml's split-KV path (which merges one query's partial sums over 512 or more
  cells from several threads) only when the query's heads are fewer than the threads; where that does not hold, K in
  Q8_0 (`-ctk q8_0`, which that path never takes, and a slower prefill: every prompt row then goes through the one-row
  kernel; docs/decisions/0012-prefill-chunks.md), the fallback.
  The default kernel without these patches multiplies a block's queries as a matrix and one token's by vec_dot, so it
  is never taken unpatched.
- a prompt's rows: a pass of the way's prefill_min_rows rows or more (TILED_ATTENTION_ROWS where flash
  attention's tiled kernel takes wide passes, else TILED_MATMUL_ROWS) computes a row as any other pass that wide
  does, a narrower one as a verified block does. So a prefill chunk's rows go in
  passes of up to N_BATCH rows, none narrower than that unless the chunk is (`_prefill_pieces`), its last row
  not split off as a step's rows are (LlamaCppSequence.prefill), and the engine cuts a prompt in chunks no
  narrower (Capabilities.prefill_min_rows): a prompt holds the same bits however a server chunks it beside
  other requests. `_prefills_in_any_chunks` checks that at load for each way but the last.
`_widest_exact_block` checks at load which block width is exact on this GGUF and this build (a GGUF with
other weight types, or an unpatched build, may allow less), and a wider block is scored in pieces of that
width, each piece reading the KV cache the previous one wrote.
- batching: in one cell pool, other sequences' passes and rollbacks change where a sequence's KV cells lie and
  so the order attention sums them in. Exact mode's shared context gives every sequence a KV stream of its own
  (llama.cpp's kv_unified = false), whose cells stay in position order, so a row scored beside other sequences'
  rows in a call of at most the exact width gets the bits it gets alone (`_decode`; docs/decisions/
  0011-exact-batching.md), and forward_batch scores every running request's step in one pass; `_batches_exactly`
  checks that at load, and where it fails the requests step one at a time. Prefill chunks still go alone
  (Capabilities.prefill_alone): a chunk's kernels depend on its rows.
The record behind these settings: docs/decisions/0009-exact-kernels.md (and scripts/experiments/
exact_kernels.py, which finds the exact widths of each setting).

Uses llama-cpp-python's thin wrappers of the C objects (`_internals.LlamaModel`, `LlamaContext`,
`LlamaBatch`), pinned to the version in requirements/base.txt.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spekula import llamacpp_check
from spekula.backends.base import Backend, Capabilities, Sequence, pass_kind
from spekula.backends.llamacpp_forms import MEASURE_WAYS_ENV, measure_again, record_key, set_faster_q6_K_form
from spekula.config import BackendConfig
from spekula.errors import ConfigError
from spekula.extras import needs_extra
from spekula.limits import check_forward
from spekula.models.cache import cache_dir, read_json, write_json

N_BATCH = 512  # tokens per llama_decode (a longer prefill, or a wider batch, is split)
# The build's patch after which one query's flash attention is split between threads only when its heads are fewer
# than the threads (patches/llamacpp/): exact mode's flash attention then keeps K in F16 (_exact_attentions)
SPLIT_KV_PATCH = "0003-one-query-splits-kv-only-past-its-heads.patch"
# The build's patch after which a one-row F16 matmul (attention over an F16 KV cache without flash attention) sums a
# row as a wider pass does (patches/llamacpp/): exact mode then runs attention as matmuls (_exact_attentions)
MATMUL_ATTENTION_PATCH = "0004-f16-sgemm-for-one-row.patch"
# The build's patch after which a context created with LLAMA_FLASH_ATTN_MIN_ROWS=N runs flash attention in passes of N
# rows or more only, matmuls in narrower ones (patches/llamacpp/)
FLASH_MIN_ROWS_PATCH = "0005-flash-attention-from-a-least-width.patch"
FLASH_MIN_ROWS_ENV = "LLAMA_FLASH_ATTN_MIN_ROWS"
# Rows from which a pass takes ggml's tiled kernels, which compute a row the same way in any pass that wide: the
# K-quant matmul on the patched build (patches/llamacpp/0002-*), and flash attention with K in F16 (GGML_FA_TILE_Q)
TILED_MATMUL_ROWS = 32
TILED_ATTENTION_ROWS = 64
log = logging.getLogger("spekula.llamacpp")

# Exact mode compares a way whose one-token passes run flash attention's one-row kernel with one whose run matmuls (the
# first exact of each in _exact_attentions' order) by what a one-token pass cost in its load-time checks, and takes the
# later only where it costs less by more than this share: which is cheaper follows the CPU (docs/decisions/
# 0014-attention-way-by-measurement.md), and a margin keeps a tie from flipping the way between loads.
WAY_MARGIN = 0.02
EXACT_WIDTHS = (17, 7, 3, 2)  # block widths exact mode tries, widest first (17: --k-max 16 plus the last token)
# Exact mode checks its width at the start of a context and again past this many tokens, where a one-token
# pass reads 512 KV cells (llama.cpp pads the cells a pass reads to 256) and other kernel paths begin.
EXACT_CHECK_AT = 300
# Attention in the shared context. llama.cpp's flash-attention kernel scores each query row alone over
# its own sequence's cells (it skips the cells its mask hides), so a sequence's attention does not depend
# on which other sequences share its pass (bit for bit), and its cost does not grow with theirs; the
# default kernel multiplies the pass's queries by the whole cell pool as matrices, so its results move
# with the batch and every running sequence's cells cost every pass. On: measured dearer only for a lone
# one-token pass (docs/decisions/0006-shared-context-flash-attention.md; `scripts/batch_costs.py
# --attention flash|default` times both).
SHARED_FLASH_ATTENTION = True


class LlamaCppBackend(Backend):
    capabilities = Capabilities(batching=False, tree_mask=False, block_invariant=False, parks=True)

    def __init__(
        self,
        gguf_path: str | Path,
        name: str | None = None,
        config: BackendConfig = BackendConfig(),
        context_length: int = 4096,
    ) -> None:
        if config.dtype != "float32":
            raise ConfigError(
                f"the llama.cpp backend computes in the GGUF's own quantised types; --dtype {config.dtype} does not "
                "apply (leave it at float32, the precision of the logits it returns)"
            )
        if not Path(gguf_path).is_file():
            raise ConfigError(f"no GGUF file at {gguf_path}")
        llamacpp_check.check(gguf_path)  # before the import: a library built for another CPU dies by a signal
        with needs_extra("llamacpp", "the llama.cpp backend"):
            import llama_cpp
            from llama_cpp._internals import LlamaModel
            from llama_cpp._logger import set_verbose
        self.gguf_path = Path(gguf_path)
        self.name = name or self.gguf_path.stem
        self.threads = config.threads or os.cpu_count() or 1
        self.exact = config.exact
        self.parallel = config.parallel  # sequences sharing one context (see the docstring)
        # one attention kernel for all of this backend's contexts, so a sequence's logits do not depend on
        # which context it got (exact mode's: _exact_attentions, chosen at load by _check_exact)
        self.flash_attention = not self.exact and self.parallel > 1 and SHARED_FLASH_ATTENTION
        set_verbose(False)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = True  # weight repacking (exact mode too: see the docstring)
        # Repacked weights are copies: a mapped file would stay resident beside them.
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        self.model = LlamaModel(path_model=str(self.gguf_path), params=params, verbose=False)
        self.vocab_size = int(self.model.n_vocab())
        self.eos_token_ids = frozenset({int(self.model.token_eos())})
        self.exact_f16_k = False  # exact mode's K cache in F16 rather than Q8_0 (_check_exact)
        self.flash_min_rows = 0  # with flash attention, matmuls in passes narrower than this (_Attention)
        self.exact_width = N_BATCH  # tokens per llama_decode for a verified block (exact mode may lower it)
        self.attention: _Attention | None = None  # exact mode's way of running attention (_check_exact)
        self.one_token_seconds: dict[str, float] = {}  # by way compared: a one-token pass in the checks
        # the runs of rows whose repacked Q6_K weights take the build's 512-bit kernels (None: no choice in this build);
        # set before exact mode's checks, which time the kernels that will run
        self.q6_K_zmm_runs = set_faster_q6_K_form(self.model, self.gguf_path, self.threads, self.vocab_size)
        if self.exact:
            heads = int(llama_cpp.llama_model_n_head(self.model.model))
            ways = _exact_attentions(llamacpp_check.installed_patches(), self.threads, heads)
            self._check_exact(context_length, ways)
        else:
            self._open_contexts(context_length)

    def _open_contexts(self, context_length: int) -> None:
        """The shared context (parallel > 1) or the first of the pool, with this backend's settings."""
        self._pool: list[_Context] = []  # contexts of one sequence each, free for the next one
        self._shared: _Context | None = None
        self._free_ids: list[int] = []  # the shared context's sequence ids no sequence holds
        if self.parallel > 1:
            # Each sequence may hold context_length tokens, all at once: the KV cache never runs out.
            self._shared = self._new_context(context_length * self.parallel, sequences=self.parallel)
            self.context_length = min(context_length, int(self._shared.ctx.n_ctx()) // self.parallel)
            self._free_ids = list(range(self.parallel))  # new_sequence takes the lowest
            # exact mode: one KV stream per sequence (_new_context), which llama.cpp does not tag across
            self.capabilities = replace(
                type(self).capabilities,
                batching=True,
                shares_prefix=True,  # exact mode: by copying a stream's cells (share_prefix)
                prefill_alone=self.exact,
                equal_rows_per_pass=self.exact,
            )
        else:
            probe = self._new_context(context_length)
            self.context_length = min(context_length, int(probe.ctx.n_ctx()))
            self._pool.append(probe)

    def _check_exact(self, context_length: int, attentions: list[_Attention]) -> None:
        """Exact mode's checks at load. A way is exact where a prompt's rows hold the same bits in any chunks of its
        prefill_min_rows or more and blocks of every width tried are exact; the last of `attentions` (flash attention,
        K in Q8_0) is taken anyway, at whatever width is exact, where no other is. Of the first exact way (in order of
        preference) and the first exact one after it whose one-token passes take the other kernel (flash attention's
        one-row kernel or matmuls; not the last way, whose prompts are dearer), the one whose one-token passes cost
        less in the checks is taken, the later only by more than WAY_MARGIN (_cheapest), and the choice is recorded
        (_WayRecord): a later load of this GGUF on this build, CPU and thread count checks the recorded way and takes
        it where it is exact, so that a restart computes the same bits (docs/decisions/0020-prefetch-spread-and-
        recorded-ways.md). Then (with a shared context) whether rows of several sequences batched in one call are
        exact too; where they are not, no batching."""
        record = _WayRecord.of(self.gguf_path, self.threads)
        if record is not None and (recorded := record.read(attentions)) is not None:
            attention, seen = recorded
            self._open_way(context_length, attention)
            self.exact_width = N_BATCH
            width, _ = self._exact_width_of(attention, attention is attentions[-1])
            if width == EXACT_WIDTHS[0]:
                log.info(f"exact mode takes {attention}, as recorded in {record.path} (which a load measured: "
                         + ", ".join(f"{way}: {1000 * s:.1f} ms a one-token pass" for way, s in seen.items())
                         + f"; {MEASURE_WAYS_ENV}=1 measures again)")  # fmt: skip
                self._take_way(attention, width, seen)
                return
            log.warning(f"llama.cpp with {attention}, the way recorded in {record.path}, is not exact at every "
                        "width on this load: measuring the ways again")  # fmt: skip
        checked: list[tuple[_Attention, int, float]] = []  # exact ways: the way, its width, s a one-token pass
        opened: _Attention | None = None  # the way whose contexts are open
        for attention in attentions:
            last = attention is attentions[-1]
            if checked and (last or attention.one_row_flash == checked[0][0].one_row_flash):
                continue  # nothing to compare: the first's one-token kernel, or the fallback
            self._open_way(context_length, attention)
            opened = attention
            self.exact_width = N_BATCH  # the checks' passes go as _decode sends them before the width is known
            width, seconds = self._exact_width_of(attention, last)
            if width == EXACT_WIDTHS[0] or (last and not checked):
                checked.append((attention, width, seconds))
                if len(checked) == 2:
                    break
            else:
                log.warning(f"llama.cpp with {attention} is not exact at every width on this build: trying the next")
        attention, width, _ = checked[_cheapest([seconds for *_, seconds in checked])]
        if attention is not opened:  # another way was checked after it (exact or not)
            self._open_way(context_length, attention)
        seen = {str(way): seconds for way, _, seconds in checked}
        log.info(f"exact mode takes {attention}: " + ", ".join(
            f"{way}: {1000 * seconds:.1f} ms a one-token pass" for way, seconds in seen.items()))  # fmt: skip
        if record is not None and len(checked) == 2:  # a choice by measurement (the fallback is no choice)
            record.write(attention, seen)
        self._take_way(attention, width, seen)

    def _exact_width_of(self, attention: _Attention, last: bool) -> tuple[int, float]:
        """The widest exact block with this way's contexts open and the seconds of its fastest one-token pass
        (_widest_exact_block); 1 and no time where its prompts are not chunk invariant, but the last way is taken
        whatever its prompt passes do (exact mode's setting before K went back to F16)."""
        chunked = last or self._prefills_in_any_chunks(attention.prefill_min_rows)
        return self._widest_exact_block() if chunked else (1, float("inf"))

    def _take_way(self, attention: _Attention, width: int, seen: dict[str, float]) -> None:
        """Exact mode runs attention `attention`'s way (its contexts open), blocks of up to `width` rows a pass; with a
        shared context, batched only where rows of several sequences in one call are exact too."""
        self.exact_width, self.attention = width, attention
        self.one_token_seconds = seen  # what the choice saw
        rows = attention.prefill_min_rows
        self.capabilities = replace(
            self.capabilities,
            block_invariant=True,
            prefill_min_rows=rows,
            prompt_pass_apart=True,  # _decode scores a folded prompt's rows, then the draft's
            # a pass up to the exact width sums a row as one token's pass does; wider ones as checked or known
            pass_kind_widths=tuple(sorted({width + 1, TILED_MATMUL_ROWS, rows})),
        )
        if self._shared is not None and not self._batches_exactly():
            # every sequence's passes alone then, each in its own stream: exact, one request at a time
            log.warning("llama.cpp's batched passes are not exact on this build: requests step one at a time")
            self.capabilities = replace(self.capabilities, batching=False)

    def _open_way(self, context_length: int, attention: _Attention) -> None:
        """This backend's contexts opened anew with exact mode's attention run `attention`'s way."""
        self.flash_attention, self.exact_f16_k = attention.flash, attention.f16_k
        self.flash_min_rows = attention.flash_min_rows
        self._open_contexts(context_length)

    def _new_context(self, n_ctx: int, sequences: int = 1) -> _Context:
        import llama_cpp
        from llama_cpp._internals import LlamaBatch, LlamaContext

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = sequences
        # One cell pool: a pass over several sequences is one ubatch, whatever their widths. Exact mode gives each
        # sequence a stream of its own instead, so that its cells lie in position order whatever the others do
        # (the module docstring).
        params.kv_unified = sequences == 1 or not self.exact
        params.n_threads = params.n_threads_batch = self.threads
        if self.exact and not self.exact_f16_k:
            params.type_k = llama_cpp.GGML_TYPE_Q8_0  # no split-KV path for one query (see the docstring)
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self.flash_attention
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        # read by llama.cpp as the context is created (patch 0005), then put back as it was
        before = os.environ.get(FLASH_MIN_ROWS_ENV)
        os.environ[FLASH_MIN_ROWS_ENV] = str(self.flash_min_rows)
        try:
            ctx = LlamaContext(model=self.model, params=params, verbose=False)
        finally:
            if before is None:
                del os.environ[FLASH_MIN_ROWS_ENV]
            else:
                os.environ[FLASH_MIN_ROWS_ENV] = before
        return _Context(ctx, LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False))

    def _widest_exact_block(self) -> tuple[int, float]:
        """The widest block (of the widths tried) whose logits equal one-token passes bit for bit, at the
        start of a context and past EXACT_CHECK_AT tokens (or as far as the context goes), and the seconds of the
        fastest of those one-token passes (what _check_exact compares ways by: other work only adds to a pass).

        With the project's patched build and the attention _check_exact tries, every width up to 17 goes through
        kernels that sum a row as one token's pass does (the module docstring); a block is scored in pieces of
        the width found here, so exactness holds for any GGUF and any build (at worst one token a pass: exact,
        and no faster than plain decoding).
        """
        tokens = [(self.vocab_size // 2 + 17 * i) % self.vocab_size for i in range(EXACT_WIDTHS[0])]
        starts = [0, min(EXACT_CHECK_AT, self.context_length - len(tokens))]
        filler = [(self.vocab_size // 3 + 7 * i) % self.vocab_size for i in range(EXACT_CHECK_AT)]
        seq = self.new_sequence()
        widest = EXACT_WIDTHS[0]
        seconds: list[float] = []
        try:
            for start in (s for s in starts if s >= 0):
                seq.truncate(0)
                if start:
                    seq.forward(filler[:start], num_logits=1)
                rows = []
                for token in tokens:
                    began = time.perf_counter()
                    rows.append(seq.forward([token]))
                    seconds.append(time.perf_counter() - began)
                single = torch.cat(rows)
                for width in (w for w in EXACT_WIDTHS if w <= widest):
                    seq.truncate(start)
                    if torch.equal(seq.forward(tokens[:width]), single[:width]):
                        break
                else:
                    return 1, min(seconds)
                widest = width
            return widest, min(seconds)
        finally:
            seq.release()

    def _prefills_in_any_chunks(self, rows: int) -> bool:
        """Whether a prompt prefilled in two passes of `rows` rows gives the next token the logits one pass of both
        gives it, bit for bit, on this GGUF and build."""
        prompt = [(self.vocab_size // 5 + 11 * i) % self.vocab_size for i in range(2 * rows + 1)]
        logits = []
        for chunks in ([prompt[:-1]], [prompt[:rows], prompt[rows:-1]]):
            seq = self.new_sequence()
            try:
                for chunk in chunks:
                    seq.prefill(chunk)
                logits.append(seq.forward(prompt[-1:]))
            finally:
                seq.release()
        return torch.equal(logits[0], logits[1])

    def _batches_exactly(self) -> bool:
        """Whether rows of three sequences of the shared context, 1, 3 and 2 of them, scored in one call of the exact
        width get the bits each sequence's rows get in a call of their own (the module docstring: a KV stream per
        sequence), on this GGUF and build, at load as the width is."""
        tokens = [(self.vocab_size // 2 + 13 * i) % self.vocab_size for i in range(40)]
        prompts, blocks = [tokens[:20], tokens[5:35], tokens[10:17]], [tokens[30:31], tokens[31:34], tokens[34:36]]
        sequences = [self.new_sequence() for _ in prompts]
        try:
            for seq, prompt in zip(sequences, prompts, strict=True):
                seq.prefill(prompt)
            together = self.forward_batch(sequences, blocks)
            for seq, prompt, block, logits in zip(sequences, prompts, blocks, together, strict=True):
                seq.truncate(len(prompt))
                if not torch.equal(seq.forward(block), logits):
                    return False
            return True
        finally:
            for seq in sequences:
                seq.release()

    def single_pass_width(self) -> int | None:
        return self.exact_width if self.exact else None

    def new_sequence(self) -> LlamaCppSequence:
        if self._free_ids:
            assert self._shared is not None  # free ids are the shared context's
            # the lowest free id: in exact mode llama.cpp puts only consecutive ids in one ubatch (_decode), so
            # the running sequences are kept to the lowest ids, which a new request's fills as others finish
            lowest = min(self._free_ids)
            self._free_ids.remove(lowest)
            return LlamaCppSequence(self, self._shared, lowest)
        context = self._pool.pop() if self._pool else self._new_context(self.context_length)
        return LlamaCppSequence(self, context, 0)

    def spare_sequences(self) -> int | None:
        return len(self._free_ids) if self._shared is not None else None

    def share_prefix(self, source: Sequence, target: Sequence, length: int) -> bool:
        """Give target source's KV cells for positions target.length .. length - 1. In the shared context they
        are tagged with target's sequence id too (llama.cpp's memory_seq_cp on a unified cache: no copy, no
        compute); they stay target's after source rolls back or is released. In exact mode, whose KV streams
        llama.cpp does not tag across (it aborts), source's cells are copied into target's stream as a parked
        cache is restored (LlamaCppSequence.copy_into: every row of source's first `length`, target's own
        included, which hold the same tokens), then cut to `length`: the cost of a memory copy, not of a pass."""
        shared = self._shared
        if shared is None or not isinstance(source, LlamaCppSequence) or not isinstance(target, LlamaCppSequence):
            return False
        if source.context is not shared or target.context is not shared:
            return False
        if source.released or target.released or source.parked or target.parked:
            return False
        start = target.length
        if not start < length <= source.length or source.tokens[:start] != target.tokens:
            return False
        if self.exact:
            return source.copy_into(target, length)
        shared.ctx.kv_cache_seq_cp(source.seq_id, target.seq_id, start, length)
        target.tokens.extend(source.tokens[start:length])
        target._kinds.extend(source._kinds[start:length])
        return True

    def forward_batch(
        self,
        sequences: Seq[LlamaCppSequence],
        token_lists: Seq[Seq[int]],
        num_logits: Seq[int | None] | None = None,
    ) -> list[torch.Tensor]:
        """One pass over several sequences, each appending its own tokens at its own positions: the
        sequences in the shared context go through one llama_decode (split at N_BATCH tokens), any other
        alone. Returns, per sequence, float32 logits [num_logits, V] for its last num_logits new tokens
        (all of them if None)."""
        n = len(sequences)
        num_logits = [None] * n if num_logits is None else list(num_logits)
        if not n == len(token_lists) == len(num_logits):
            raise ValueError("forward_batch needs one token list and num_logits per sequence")
        if len({id(s) for s in sequences}) != n:
            raise ValueError("a sequence appears twice in one batch")
        blocks = []
        for seq, ids, wanted in zip(sequences, token_lists, num_logits, strict=True):
            if seq.backend is not self:
                raise ValueError("the sequence belongs to another backend")
            seq.check_open()
            ids = [int(t) for t in ids]
            wanted = len(ids) if wanted is None else wanted
            check_forward(seq.length, len(ids), seq.context_length)
            if not 1 <= wanted <= len(ids):
                raise ValueError(f"num_logits must be in [1, {len(ids)}], got {wanted}")
            blocks.append(_Block(seq, ids, wanted))
        shared = [b for b in blocks if b.seq.context is self._shared and self._shared is not None]
        groups = ([shared] if shared else []) + [[b] for b in blocks if b not in shared]
        logits: dict[int, torch.Tensor] = {}
        for group in groups:
            for block, out in zip(group, self._decode(group[0].seq.context, group), strict=True):
                logits[id(block)] = out
        for block in blocks:
            block.seq.tokens.extend(block.ids)
        return [logits[id(block)] for block in blocks]

    def _decode(self, context: _Context, blocks: list[_Block]) -> list[torch.Tensor]:
        """Append every block to its sequence's cache in `context`, in llama_decode calls of at most
        N_BATCH tokens; the logits each block asked for, in its order. In exact mode a block's draft rows go in calls
        of at most the exact width, packed across sequences, and so does its pending token where it is the block's
        first row (a step's); a block that starts with prompt tokens (the prompt's last chunk folded into the first
        step, which plain and speculative decoding prefill alike) has them and the pending token after them (the
        prompt's last) in calls of its own, as a prefill chunk (not scored) has all its rows. A call that narrow
        scores every row as a pass of that row alone would (vec_dot, and attention over the row's own KV stream that
        sums each row alike in any pass that narrow: _exact_attentions), whichever sequences share it."""
        by_block = [
            [
                (token, block.seq.length + i, block.seq.seq_id, i >= len(block.ids) - block.wanted, b)
                for i, token in enumerate(block.ids)
            ]
            for b, block in enumerate(blocks)
        ]
        if self.exact_width < N_BATCH:  # exact mode, past the load-time check
            calls, scored = [], []
            for block, rows in zip(blocks, by_block, strict=True):
                if block.narrow:  # a prefill chunk computed as a step's rows (PrefillPlan): none
                    head = 0
                elif not block.scored:  # a prefill chunk: all its rows
                    head = len(rows)
                elif block.wanted < len(rows):  # prompt rows first: they and the prompt's last token, as llama-server
                    head = len(rows) - block.wanted + 1  # does (plain decoding's first step too)
                else:  # a step: its pending token and draft all scored
                    head = 0
                # this sequence's alone, as plain decoding prefills them, in passes of at least prefill_min_rows
                calls += _prefill_pieces(rows[:head], N_BATCH, self.capabilities.prefill_min_rows)
                scored += rows[head:]
            # every sequence's scored rows, packed, by sequence id: with a KV stream per sequence llama.cpp puts a
            # run of consecutive ids in one ubatch (and takes as many rows of each; llama_batch_allocr::split_equal)
            scored.sort(key=lambda row: row[2])
            calls += _pieces(scored, self.exact_width)
        else:
            calls = _pieces([row for rows in by_block for row in rows], N_BATCH)
        out = [np.empty((block.wanted, self.vocab_size), dtype=np.float32) for block in blocks]
        filled = [0] * len(blocks)
        batch, vocab = context.batch, self.vocab_size
        for chunk in calls:
            raw = batch.batch  # filled as llama-cpp-python's set_batch does, choosing which rows get logits
            raw.n_tokens = len(chunk)
            for i, (token, position, seq_id, wants_logits, _) in enumerate(chunk):
                raw.token[i] = token
                raw.pos[i] = position
                raw.seq_id[i][0] = seq_id
                raw.n_seq_id[i] = 1
                raw.logits[i] = wants_logits
            context.ctx.decode(batch)
            kind = pass_kind(len(chunk), self.capabilities.pass_kind_widths)
            for *_, b in chunk:  # each row's pass kind (Sequence.pass_kinds): the calls keep a block's rows in order
                blocks[b].seq._kinds.append(kind)
            owners = [b for *_, wants_logits, b in chunk if wants_logits]
            if owners:
                got = context.logits(len(owners), vocab)
                for row, b in zip(got, owners, strict=True):  # copied out before the next llama_decode overwrites them
                    out[b][filled[b]] = row
                    filled[b] += 1
        return [torch.from_numpy(logits) for logits in out]


def _pieces(rows: list, width: int) -> list[list]:
    """rows in consecutive calls of at most `width`."""
    return [rows[start : start + width] for start in range(0, len(rows), width)]


def _prefill_pieces(rows: list, width: int, least: int) -> list[list]:
    """rows in consecutive calls of at most `width` (at least 2 * least), none of fewer than `least` rows unless there
    are fewer than that in all: the last two calls share what would have left a short last one."""
    pieces = _pieces(rows, width)
    if len(pieces) > 1 and len(pieces[-1]) < least:
        both = pieces[-2] + pieces[-1]
        pieces[-2:] = [both[: len(both) - least], both[len(both) - least :]]
    return pieces


@dataclass(frozen=True)
class _Attention:
    """One way exact mode may run attention (the module docstring)."""

    flash: bool  # llama.cpp's flash-attention kernel; else matmuls over K and V (V stored transposed)
    f16_k: bool  # K cache in F16; else Q8_0
    prefill_min_rows: int  # a prompt pass's least rows, from which its kernels sum a row as any pass that wide does
    flash_min_rows: int = 0  # with flash: matmuls in passes narrower than this (patch 0005), V copied out transposed

    @property
    def one_row_flash(self) -> bool:
        """A one-token pass runs flash attention's one-row kernel (else matmuls)."""
        return self.flash and self.flash_min_rows <= 1

    def __str__(self) -> str:
        kind = "flash attention" if self.flash else "attention as matmuls"
        if self.flash and self.flash_min_rows:
            kind = f"flash attention from {self.flash_min_rows} rows, matmuls below"
        return f"{kind}, K in {'F16' if self.f16_k else 'Q8_0'}"


@dataclass(frozen=True)
class _WayRecord:
    """Where exact mode keeps the attention way a load chose by measurement, for this GGUF file on this build of
    llama.cpp (its library files), this CPU and this thread count: where two ways cost about the same, a choice timed
    anew at every load flips between restarts, and the ways' rows hold other bits (docs/decisions/0020-prefetch-
    spread-and-recorded-ways.md). A later load checks the recorded way and takes it where it is exact;
    SPEKULA_MEASURE_WAYS=1 measures the ways again and records the new choice."""

    path: Path

    @classmethod
    def of(cls, gguf: Path, threads: int) -> _WayRecord | None:
        key = record_key(gguf, threads)
        return None if key is None else cls(cache_dir() / "llamacpp-ways" / f"{key}.json")

    def read(self, attentions: list[_Attention]) -> tuple[_Attention, dict[str, float]] | None:
        """The recorded way (one of `attentions`) and the one-token passes its choice saw; None where none is
        recorded, the record is unreadable or SPEKULA_MEASURE_WAYS=1."""
        if measure_again():
            return None
        data = read_json(self.path)  # None where there is none or it is unreadable
        if data is None:
            return None
        try:
            way, seen = data["way"], {str(k): float(v) for k, v in data["one_token_seconds"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):  # not a record of this shape
            return None
        return next(((a, seen) for a in attentions if str(a) == way), None)

    def write(self, attention: _Attention, seen: dict[str, float]) -> None:
        try:
            write_json(self.path, {"way": str(attention), "one_token_seconds": seen})
        except OSError as e:  # a read-only cache: every load measures, as before
            log.warning(f"could not record exact mode's attention way in {self.path}: {e}")


def _cheapest(seconds: list[float], margin: float = WAY_MARGIN) -> int:
    """Which of the ways listed in order of preference with what a one-token pass cost in each to take: the first,
    unless a later one costs less than the way kept so far by more than `margin` of it."""
    kept = 0
    for i, cost in enumerate(seconds):
        if cost < seconds[kept] * (1 - margin):
            kept = i
    return kept


def _exact_attentions(patches: frozenset[str], threads: int, heads: int) -> list[_Attention]:
    """The ways exact mode may run attention on a build with these patches, in order of preference; the last needs
    none (docs/decisions/0013-exact-attention-without-flash.md; which one-token pass is cheaper follows the CPU, and
    _check_exact measures it: docs/decisions/0014-attention-way-by-measurement.md):
    - flash attention in a prompt's passes of TILED_ATTENTION_ROWS or more (its tiled kernel), matmuls in narrower
      ones (patches 0004 and 0005): a verified block over a long context costs less than with flash attention's
      one-row kernel, a prompt about the same, a one-token pass more or less by CPU;
    - matmuls in every pass (patch 0004): blocks as cheap, a prompt a few percent dearer (its passes compute every
      masked cell);
    - flash attention, K in F16, where patch 0003 leaves one query's attention unsplit (threads at most the heads);
    - flash attention, K in Q8_0 (a slower prefill: every prompt row takes the one-row kernel)."""
    ways = []
    if MATMUL_ATTENTION_PATCH in patches and FLASH_MIN_ROWS_PATCH in patches:
        ways.append(_Attention(flash=True, f16_k=True, prefill_min_rows=TILED_ATTENTION_ROWS,
                               flash_min_rows=TILED_ATTENTION_ROWS))  # fmt: skip
    if MATMUL_ATTENTION_PATCH in patches:
        ways.append(_Attention(flash=False, f16_k=True, prefill_min_rows=TILED_MATMUL_ROWS))
    if SPLIT_KV_PATCH in patches and threads <= heads:
        ways.append(_Attention(flash=True, f16_k=True, prefill_min_rows=TILED_ATTENTION_ROWS))
    return [*ways, _Attention(flash=True, f16_k=False, prefill_min_rows=TILED_MATMUL_ROWS)]


@dataclass(eq=False)
class _Context:
    """A llama.cpp context and the batch its passes are written into (compared by identity: a resource)."""

    ctx: Any  # llama_cpp._internals.LlamaContext
    batch: Any  # llama_cpp._internals.LlamaBatch
    _address: int | None = None  # of llama.cpp's logits buffer when the views below were made
    _views: dict[int, np.ndarray] = field(default_factory=dict)  # rows -> a view of that buffer

    def logits(self, rows: int, vocab: int) -> np.ndarray:
        """The last llama_decode's logits, [rows, vocab]: a view of llama.cpp's own buffer, valid until the next
        llama_decode. Views are kept while the buffer stays where it is (llama.cpp moves it only to grow it):
        making numpy's ctypes view anew was a large share of this backend's Python around a plain step
        (scripts/experiments/step_overhead.py measures it)."""
        address = ctypes.cast(self.ctx.get_logits(), ctypes.c_void_p).value
        if address != self._address:
            self._address, self._views = address, {}
        view = self._views.get(rows)
        if view is None:
            assert address is not None  # llama.cpp has logits after a llama_decode that asked for some
            buffer = (ctypes.c_float * (rows * vocab)).from_address(address)
            # a ctypes array has the buffer protocol, which numpy's stubs do not take it to have
            view = self._views[rows] = np.frombuffer(buffer, dtype=np.float32).reshape(rows, vocab)  # type: ignore[call-overload]
        return view


@dataclass(eq=False)
class _Block:
    seq: LlamaCppSequence
    ids: list[int]
    wanted: int  # logits for the last `wanted` tokens
    scored: bool = True  # its logits are read (False: a prefill chunk's, not split off in exact mode: _decode)
    narrow: bool = False  # a prefill chunk in calls of at most the exact width, as a step's rows (exact mode)


class LlamaCppSequence(Sequence):
    def __init__(self, backend: LlamaCppBackend, context: _Context, seq_id: int) -> None:
        super().__init__(backend.context_length)
        self.backend = backend
        self.context = context
        self.seq_id = seq_id
        self.released = False
        self._state: np.ndarray | None = None  # a parked sequence's cache (llama_state_seq_get_data's bytes)
        self._kinds = bytearray()  # per held token, its row's pass kind (_decode appends them before `tokens` grows)
        context.ctx.kv_cache_seq_rm(seq_id, 0, -1)

    @property
    def pass_kinds(self) -> Seq[int] | None:
        return self._kinds

    def check_open(self) -> None:
        if self.released:  # its sequence id or context may be another sequence's now
            raise RuntimeError("this sequence was released; open a new one with backend.new_sequence()")
        if self.parked:  # as released: its id is free; its cache lives in host memory
            raise RuntimeError("this sequence is parked; restore it into a new sequence (restore_into)")

    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        self.check_open()
        return self.backend._decode(self.context, [_Block(self, token_ids, num_logits)])[0]

    def prefill(self, token_ids: Seq[int], narrow: bool = False) -> None:
        """A prompt chunk in passes of up to N_BATCH tokens, its last row not split off in exact mode: as in
        one whole prefill, a row of a pass of 32 tokens or more goes through ggml's tiled matmul wherever the
        chunk ends (_decode). narrow (exact mode): in passes of at most the exact width, as a step's rows."""
        if not token_ids:  # an empty chunk (a one-token prompt): nothing to prefill
            return
        check_forward(self.length, len(token_ids), self.context_length)
        self.check_open()
        self.backend._decode(self.context, [_Block(self, list(token_ids), 1, scored=False, narrow=narrow)])
        self.tokens.extend(int(t) for t in token_ids)

    def _truncate(self, length: int) -> None:
        self.check_open()
        self.context.ctx.kv_cache_seq_rm(self.seq_id, length, -1)
        del self._kinds[length:]

    @property
    def parked(self) -> bool:  # type: ignore[override]  # a class attribute in Sequence
        return self._state is not None

    def park(self) -> bool:
        """Copy the sequence's KV cells into host memory (llama_state_seq_get_data, as llama-server's prompt
        cache in RAM does), then free what it held: in the shared context its cells and sequence id (a
        finished request's cells left there would be read past by every later pass of the others, as
        llama.cpp builds each pass's attention mask over every cell in use: `scripts/experiments/
        parked_caches.py` measures it); a context of its own goes back to the pool. Kept conversations then
        hold host memory (their tokens' K and V) rather than cells or a context each."""
        if self.released or self.parked or not self.tokens:
            return False
        state = self._state_bytes()
        if state is None:
            return False
        self.context.ctx.kv_cache_seq_rm(self.seq_id, 0, -1)
        if self.context is self.backend._shared:
            self.backend._free_ids.append(self.seq_id)
        else:
            self.backend._pool.append(self.context)
        self._state = state
        return True

    def copy_into(self, target: LlamaCppSequence, length: int) -> bool:
        """Copy this live sequence's KV cells into target's sequence (llama_state_seq_get_data, then _set_data, as
        park and restore_into do, without freeing these), cut to the first `length`: target's own cells are
        replaced (its tokens must be a prefix of this sequence's). False (target as it was) where llama.cpp
        refuses."""
        mine, theirs = self._state_bytes(), target._state_bytes() if target.length else None
        if mine is None or (target.length and theirs is None):
            return False
        if not target._set_state(mine):
            if theirs is not None and not target._set_state(theirs):
                raise RuntimeError("llama.cpp refused a sequence's own cache back")  # its cells are gone
            return False
        target.tokens, target._kinds = list(self.tokens), bytearray(self._kinds)
        target.truncate(length)
        return True

    def _state_bytes(self) -> np.ndarray | None:
        """The sequence's KV cells as llama_state_seq_get_data writes them (None: llama.cpp refused)."""
        import llama_cpp

        ctx = self.context.ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, self.seq_id)
        state = np.empty(size, dtype=np.uint8)
        return state if llama_cpp.llama_state_seq_get_data(ctx, _pointer(state), size, self.seq_id) == size else None

    def _set_state(self, state: np.ndarray) -> bool:
        """Replace the sequence's KV cells with `state` (_state_bytes'); False: llama.cpp refused, and it holds
        none (its tokens are the caller's to set)."""
        import llama_cpp

        self.context.ctx.kv_cache_seq_rm(self.seq_id, 0, -1)
        ctx = self.context.ctx.ctx
        if llama_cpp.llama_state_seq_set_data(ctx, _pointer(state), state.size, self.seq_id) == state.size:
            return True
        self.context.ctx.kv_cache_seq_rm(self.seq_id, 0, -1)  # what a failed read left
        return False

    def restore_into(self, target: Sequence) -> bool:
        state = self._state
        if state is None or not isinstance(target, LlamaCppSequence) or target.backend is not self.backend:
            return False
        if target.released or target.parked or target.length or not target._set_state(state):
            return False
        target.tokens = list(self.tokens)
        target._kinds = bytearray(self._kinds)
        return True

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.tokens.clear()
        self._kinds.clear()
        if self._state is not None:  # parked: its cells and id were freed then
            self._state = None
            return
        self.context.ctx.kv_cache_seq_rm(self.seq_id, 0, -1)
        if self.context is self.backend._shared:
            self.backend._free_ids.append(self.seq_id)
        else:
            self.backend._pool.append(self.context)


def _pointer(buffer: np.ndarray) -> Any:
    """buffer's bytes as the uint8 pointer llama.cpp's state functions take."""
    return buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
