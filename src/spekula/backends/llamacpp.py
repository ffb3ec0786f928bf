"""llama.cpp as a runtime, through llama-cpp-python (GGUF models, quantised kernels).

One llama.cpp context per sequence (the weights are memory-mapped, so contexts share them); a
released sequence's context goes back to a pool. `forward` is one llama_decode over the block with
logits requested for the last num_logits positions only (a long prefill does not pay the output
layer for every prompt token); `truncate` removes the KV cells from the cut on (llama.cpp's
kv_cache_seq_rm) and moves the position, so rollback costs nothing.

Uses llama-cpp-python's context and batch wrappers (`Llama._ctx`, `Llama._batch`), pinned to the
version in requirements/base.txt.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from spekula.backends.base import Backend, Capabilities, Sequence
from spekula.config import BackendConfig
from spekula.errors import ConfigError
from spekula.extras import needs_extra


class LlamaCppBackend(Backend):
    capabilities = Capabilities(batching=False, tree_mask=False, block_invariant=False)

    def __init__(self, gguf_path: str | Path, name: str | None = None, config: BackendConfig = BackendConfig(), context_length: int = 4096) -> None:
        with needs_extra("llamacpp", "the llama.cpp backend"):
            import llama_cpp  # noqa: F401
        if config.dtype != "float32":
            raise ConfigError(
                f"the llama.cpp backend computes in the GGUF's own quantised types; --dtype {config.dtype} does not apply "
                "(leave it at float32, the precision of the logits it returns)"
            )
        self.gguf_path = Path(gguf_path)
        self.name = name or self.gguf_path.stem
        self.threads = config.threads or os.cpu_count() or 1
        self._pool: list = []
        probe = self._new_context(context_length)
        self.context_length = min(context_length, int(probe.n_ctx()))
        self.vocab_size = int(probe.n_vocab())
        self.eos_token_ids = frozenset({int(probe.token_eos())})
        self._pool.append(probe)

    def _new_context(self, n_ctx: int):
        from llama_cpp import Llama

        return Llama(
            model_path=str(self.gguf_path), n_ctx=n_ctx, n_batch=512, n_threads=self.threads,
            n_threads_batch=self.threads, logits_all=False, verbose=False,
        )

    def new_sequence(self) -> "LlamaCppSequence":
        llm = self._pool.pop() if self._pool else self._new_context(self.context_length)
        return LlamaCppSequence(self, llm)


class LlamaCppSequence(Sequence):
    def __init__(self, backend: LlamaCppBackend, llm) -> None:
        super().__init__(backend.context_length)
        self.backend = backend
        self.llm = llm
        self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)

    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        ctx, batch, n_batch = self.llm._ctx, self.llm._batch, self.llm.n_batch
        position = self.length
        rows: list[np.ndarray] = []
        for start in range(0, len(token_ids), n_batch):
            chunk = token_ids[start : start + n_batch]
            want = max(0, num_logits - (len(token_ids) - start - len(chunk)))  # outputs wanted from this chunk
            want = min(want, len(chunk))
            raw = batch.batch  # llama_batch: fill it as llama-cpp-python's set_batch does, choosing which rows get logits
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
        self.llm._ctx.kv_cache_seq_rm(-1, length, -1)

    def release(self) -> None:
        self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        self.tokens.clear()
        if self.llm not in self.backend._pool:
            self.backend._pool.append(self.llm)
