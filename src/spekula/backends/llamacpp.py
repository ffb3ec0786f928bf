"""llama.cpp as a runtime, through llama-cpp-python (GGUF models, quantised kernels).

One model per backend and one llama.cpp context per sequence over it; a released sequence's context
goes back to a pool. `forward` is one llama_decode over the block with logits requested for the last
num_logits positions only (a long prefill does not pay the output layer for every prompt token);
`truncate` removes the KV cells from the cut on (llama.cpp's kv_cache_seq_rm) and moves the position,
so rollback costs nothing.

Exact mode (BackendConfig.exact) makes a token's logits independent of how many tokens share its pass,
bit for bit, so greedy speculative output equals plain decoding: the weights stay in the GGUF's own
layout (llama.cpp's repacked 4-row kernels compute a block of 4 or more tokens with another
accumulation order than one token) and attention runs in llama.cpp's flash-attention kernel (which
computes each query row alone; the default kernel multiplies a block's queries as a matrix), and a
block wider than llama.cpp keeps exact is scored in narrower pieces (`_widest_exact_block`). Its cost
by width is in docs/BENCHMARKS.md.

Uses llama-cpp-python's thin wrappers of the C objects (`_internals.LlamaModel`, `LlamaContext`,
`LlamaBatch`), pinned to the version in requirements/base.txt.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spekula.backends.base import Backend, Capabilities, Sequence
from spekula.config import BackendConfig
from spekula.errors import ConfigError
from spekula.extras import needs_extra


N_BATCH = 512  # tokens per llama_decode (a longer prefill is split)
EXACT_WIDTHS = (17, 7, 3)  # block widths exact mode tries, widest first (17: --k-max 16 plus the last token)
LONGEST_BLOCK = 65  # a verified block is at most k + 1 tokens (k <= 64); anything longer is a prompt


class LlamaCppBackend(Backend):
    capabilities = Capabilities(batching=False, tree_mask=False, block_invariant=False)

    def __init__(
        self,
        gguf_path: str | Path,
        name: str | None = None,
        config: BackendConfig = BackendConfig(),
        context_length: int = 4096,
    ) -> None:
        with needs_extra("llamacpp", "the llama.cpp backend"):
            import llama_cpp
            from llama_cpp._internals import LlamaModel
            from llama_cpp._logger import set_verbose
        if config.dtype != "float32":
            raise ConfigError(
                f"the llama.cpp backend computes in the GGUF's own quantised types; --dtype {config.dtype} does not "
                "apply (leave it at float32, the precision of the logits it returns)"
            )
        if not Path(gguf_path).is_file():
            raise ConfigError(f"no GGUF file at {gguf_path}")
        self.gguf_path = Path(gguf_path)
        self.name = name or self.gguf_path.stem
        self.threads = config.threads or os.cpu_count() or 1
        self.exact = config.exact
        set_verbose(False)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = not self.exact  # weight repacking
        # Repacked weights are copies: a mapped file would stay resident beside them. Unrepacked, the
        # mapped file is the weights.
        if not self.exact:
            params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        self.model = LlamaModel(path_model=str(self.gguf_path), params=params, verbose=False)
        self.vocab_size = int(self.model.n_vocab())
        self.eos_token_ids = frozenset({int(self.model.token_eos())})
        self._pool: list[_Context] = []
        probe = self._new_context(context_length)
        self.context_length = min(context_length, int(probe.ctx.n_ctx()))
        self._pool.append(probe)
        self.exact_width = N_BATCH  # tokens per llama_decode for a verified block (exact mode may lower it)
        if self.exact:
            self.exact_width = self._widest_exact_block()
            self.capabilities = replace(type(self).capabilities, block_invariant=True)

    def _new_context(self, n_ctx: int) -> "_Context":
        import llama_cpp
        from llama_cpp._internals import LlamaBatch, LlamaContext

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_threads = params.n_threads_batch = self.threads
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.exact else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        ctx = LlamaContext(model=self.model, params=params, verbose=False)
        return _Context(ctx, LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False))

    def _widest_exact_block(self) -> int:
        """The widest block (of the widths tried) whose logits equal one-token passes bit for bit.

        With repacking off and flash attention on, a narrow block goes through the same dot products as
        one token, but llama.cpp (0.3.36's build) picks other kernels from some width on (8 tokens for the
        catalogue's Q4_K_M GGUFs on AVX2); a block is then scored in pieces of the width found
        here, each piece reading the KV cache the previous one wrote, so exactness holds for any GGUF.
        """
        tokens = [(self.vocab_size // 2 + 17 * i) % self.vocab_size for i in range(EXACT_WIDTHS[0])]
        seq = self.new_sequence()
        try:
            single = torch.cat([seq.forward([t]) for t in tokens])
            for width in EXACT_WIDTHS:
                seq.truncate(0)
                if torch.equal(seq.forward(tokens[:width]), single[:width]):
                    return width
            return 1
        finally:
            seq.release()

    def new_sequence(self) -> "LlamaCppSequence":
        context = self._pool.pop() if self._pool else self._new_context(self.context_length)
        return LlamaCppSequence(self, context)


@dataclass
class _Context:
    """One sequence's llama.cpp context and the batch its passes are written into."""

    ctx: Any  # llama_cpp._internals.LlamaContext
    batch: Any  # llama_cpp._internals.LlamaBatch


class LlamaCppSequence(Sequence):
    def __init__(self, backend: LlamaCppBackend, context: _Context) -> None:
        super().__init__(backend.context_length)
        self.backend = backend
        self.context = context
        context.ctx.kv_cache_seq_rm(-1, 0, -1)

    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        ctx, batch = self.context.ctx, self.context.batch
        position = self.length
        rows: list[np.ndarray] = []
        # A prompt is scored by one call in plain and in speculative decoding alike, so only blocks need
        # the exact width.
        step = self.backend.exact_width if len(token_ids) <= LONGEST_BLOCK else N_BATCH
        for start in range(0, len(token_ids), step):
            chunk = token_ids[start : start + step]
            want = max(0, num_logits - (len(token_ids) - start - len(chunk)))  # outputs wanted from this chunk
            want = min(want, len(chunk))
            # llama_batch: filled as llama-cpp-python's set_batch does, choosing which rows get logits
            raw = batch.batch
            raw.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                raw.token[i] = token
                raw.pos[i] = position + i
                raw.seq_id[i][0] = 0
                raw.n_seq_id[i] = 1
                raw.logits[i] = i >= len(chunk) - want
            ctx.decode(batch)
            vocab = self.backend.vocab_size
            if want:
                logits = np.ctypeslib.as_array(ctx.get_logits(), shape=(want * vocab,))
                rows.append(logits.reshape(want, vocab).copy())
            position += len(chunk)
        return torch.from_numpy(np.concatenate(rows)[-num_logits:])

    def _truncate(self, length: int) -> None:
        self.context.ctx.kv_cache_seq_rm(-1, length, -1)

    def release(self) -> None:
        self.context.ctx.kv_cache_seq_rm(-1, 0, -1)
        self.tokens.clear()
        if self.context not in self.backend._pool:
            self.backend._pool.append(self.context)
