"""Hugging Face transformers as a runtime: any causal LM directory transformers can load.

Rollback uses DynamicCache.crop, so the cache grows by concatenation; the native runner (preallocated
cache, rollback = moving a pointer) is the fast path, this one is the reference.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from spekula.backends.base import Backend, Capabilities, Sequence
from spekula.config import BackendConfig

if TYPE_CHECKING:  # transformers is imported when a model is loaded, not with this module
    from transformers import PreTrainedModel

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TransformersBackend(Backend):
    capabilities = Capabilities(batching=False, tree_mask=False)

    def __init__(self, model: PreTrainedModel, name: str = "model", config: BackendConfig = BackendConfig()) -> None:
        self.model = model.eval()
        self.name = name
        self.config = config
        hf_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context_length = int(getattr(hf_config, "max_position_embeddings", 4096) or 4096)
        self.eos_token_ids = frozenset(_eos_ids(model))

    @classmethod
    def load(
        cls, path: str | Path, name: str | None = None, config: BackendConfig = BackendConfig()
    ) -> TransformersBackend:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoModelForCausalLM

        if config.threads:
            torch.set_num_threads(config.threads)  # process-wide: torch has no per-model thread pool
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=TORCH_DTYPES[config.dtype])
        return cls(model, name or Path(path).name, config)

    def new_sequence(self) -> TransformersSequence:
        return TransformersSequence(self)


class TransformersSequence(Sequence):
    def __init__(self, backend: TransformersBackend) -> None:
        super().__init__(backend.context_length)
        from transformers import DynamicCache

        self.backend = backend
        self.cache = DynamicCache(config=backend.model.config)

    @torch.inference_mode()
    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        start = self.length
        input_ids = torch.tensor([token_ids], dtype=torch.long)  # [1, S]
        position_ids = torch.arange(start, start + len(token_ids)).unsqueeze(0)  # [1, S]
        out = self.backend.model(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=num_logits,
        )
        return out.logits[0, -num_logits:].float()  # [num_logits, V]

    def _truncate(self, length: int) -> None:
        self.cache.crop(length - self.length)  # transformers 5.x: a negative count of tokens to drop

    def release(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.backend.model.config)
        self.tokens.clear()


def _eos_ids(model: torch.nn.Module) -> set[int]:
    ids: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), model.config):
        value = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
