"""Real models, loaded once per test session. Every test here is marked `model`."""

from __future__ import annotations

import pytest
import torch

from spekula.backends.hf import TransformersBackend
from spekula.config import BackendConfig
from spekula.pipeline import load_model


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2-135m", BackendConfig(dtype="float32"))  # (backend, codec)


@pytest.fixture(scope="session")
def qwen_pair():
    target, codec = load_model("qwen2.5-coder-1.5b", BackendConfig(dtype="float32"))
    draft, _ = load_model("qwen2.5-coder-0.5b", BackendConfig(dtype="float32"))
    return target, draft, codec


@pytest.fixture(scope="session")
def random_smollm2_draft(smollm2):
    """A randomly initialised tiny Llama with SmolLM2's vocabulary: almost no draft is accepted."""
    from transformers import LlamaConfig, LlamaForCausalLM

    target, _ = smollm2
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=target.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=target.context_length,
    )
    return TransformersBackend(LlamaForCausalLM(config), name="random-llama")
