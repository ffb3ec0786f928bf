"""The native runner on the built-in models, against the transformers backend (fp32).

Tolerance: |native - transformers| <= 1e-4 + 1e-5 |logit|. For scale, transformers disagrees with
itself by up to 9e-5 on SmolLM2 (|logits| up to ~40) between a 21-token prefill and the same
positions fed incrementally: the bound sits at fp32's own noise for a 30-layer model.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spekula.backends import load_backend
from spekula.backends.hf import TransformersBackend
from spekula.backends.native import NativeBackend, Transformer
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.models import resolve
from spekula.proposers import DraftModelFactory
from spekula.text import TextCodec

pytestmark = pytest.mark.model

PROMPT = "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"
FP32 = BackendConfig(dtype="float32")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def close(actual, expected):
    # fp32 logits of magnitude ~30: oneDNN's packed kernels sum in another order than MKL (seen: 1.2e-4)
    torch.testing.assert_close(actual, expected, atol=2e-4, rtol=1e-5)


def native(name: str, config: BackendConfig = FP32) -> NativeBackend:
    return load_backend("native", resolve(name).hf_dir, name, config)


def transformers(name: str) -> tuple[TransformersBackend, TextCodec]:
    """The reference, loaded explicitly (whatever backend the pipeline defaults to)."""
    hf_dir = resolve(name).hf_dir
    return TransformersBackend.load(hf_dir, name, FP32), TextCodec.load(hf_dir)


@pytest.fixture(scope="module")
def smollm2():
    """(native, transformers, codec) for SmolLM2-135M: Llama, tied embeddings."""
    return native("smollm2-135m"), *transformers("smollm2-135m")


@pytest.fixture(scope="module")
def qwen05():
    """(native, transformers, codec) for Qwen2.5-Coder-0.5B: q/k/v bias, untied output layer."""
    return native("qwen2.5-coder-0.5b"), *transformers("qwen2.5-coder-0.5b")


@pytest.fixture(params=["smollm2", "qwen05"])
def models(request):
    return request.getfixturevalue(request.param)


def test_logits_match_transformers_through_blocks_and_rollback(models):
    fast, reference, codec = models
    ids = codec.encode(PROMPT)
    a, b = fast.new_sequence(), reference.new_sequence()
    close(a.forward(ids), b.forward(ids))  # prefill, every position
    for block in ([198], [220, 220, 220, 257, 374], [16, 17, 18, 19, 20, 21, 22, 23, 24], [11, 12]):  # 1, 5, 9, 2
        close(a.forward(block), b.forward(block))
    a.truncate(len(ids) + 3)  # roll back into the middle of the 5-token block
    b.truncate(len(ids) + 3)
    close(a.forward([500, 501, 502]), b.forward([500, 501, 502]))
    assert a.tokens == b.tokens


def test_greedy_decoding_equals_transformers(models):
    fast, reference, codec = models
    ids = codec.encode(PROMPT)
    stop = StopConfig(max_tokens=32, ignore_eos=True)
    mine = Engine(fast).generate(ids, SamplingParams(), stop).run().token_ids
    theirs = Engine(reference).generate(ids, SamplingParams(), stop).run().token_ids
    assert mine == theirs and len(mine) == 32


def test_speculative_greedy_equality_native_and_mixed_pairs(smollm2):
    native_smollm2, reference, codec = smollm2
    torch.manual_seed(0)
    # A random model of the same vocabulary: nearly every draft is rejected.
    tiny = Transformer(
        replace(native_smollm2.args, n_layers=2, dim=64, hidden_dim=128, n_heads=4, n_kv_heads=2, head_dim=16)
    )
    random_draft = NativeBackend(tiny.eval(), name="random-native")
    rows = NativeBackend.load(resolve("smollm2-135m").hf_dir, layout="rows")  # the unpacked layout
    pairs = {
        "native <- native (self)": (native_smollm2, rows),
        "native <- native (random)": (native_smollm2, random_draft),
        "native <- transformers": (native_smollm2, reference),
        "transformers <- native": (reference, native_smollm2),
    }
    stop = StopConfig(max_tokens=24)
    for prompt in (PROMPT, "# Parse a CSV file and return the rows as dictionaries\nimport csv\n"):
        ids = codec.encode(prompt)
        plain = Engine(reference).generate(ids, SamplingParams(), stop).run().token_ids
        assert Engine(native_smollm2).generate(ids, SamplingParams(), stop).run().token_ids == plain
        for name, (target, draft) in pairs.items():
            for k in (1, 4):
                spec = (
                    Engine(target, DraftModelFactory(draft), SpecConfig(k=k))
                    .generate(ids, SamplingParams(), stop)
                    .run()
                )
                assert spec.token_ids == plain, f"{name}, k={k}, {prompt!r}"
                if "random" in name:
                    assert spec.stats.alpha < 0.2
                else:
                    assert spec.stats.alpha > 0.95


def test_batched_forward_equals_one_at_a_time(smollm2):
    native_smollm2, _, codec = smollm2
    prompts = [codec.encode(PROMPT), codec.encode("The three primary colours are"), codec.encode("import os\n")]
    singles = [native_smollm2.new_sequence().forward(p, num_logits=1) for p in prompts]
    seqs = [native_smollm2.new_sequence() for _ in prompts]
    batched = native_smollm2.forward_batch(seqs, prompts, num_logits=[1, 1, 1])
    for one, many in zip(singles, batched, strict=True):
        close(many, one)
    nexts = [[int(x.argmax())] for x in batched]
    step = native_smollm2.forward_batch(seqs, nexts)
    for seq, p, n, out in zip(seqs, prompts, nexts, step, strict=True):
        close(out, native_smollm2.new_sequence().forward(p + n, num_logits=1))
        assert seq.tokens == p + n


def test_gguf_loads_the_same_weights_as_the_converted_directory():
    """The built-in SmolLM2 GGUF (Q4_1/Q8_0, llama-permuted q/k) dequantised natively, rounded to bf16,
    equals the converted directory bit for bit (the converter dequantised the same file to bf16)."""
    from spekula.backends.native_loader import load_weights

    model = resolve("smollm2-135m")
    from_gguf = load_weights(model.gguf_path, torch.bfloat16)
    from_dir = load_weights(model.hf_dir, torch.bfloat16)
    assert from_gguf.args == from_dir.args and from_gguf.eos_token_ids == from_dir.eos_token_ids
    assert sorted(from_gguf.weights) == sorted(from_dir.weights)
    for key, value in from_dir.weights.items():
        assert torch.equal(from_gguf.weights[key], value), key


def test_bfloat16_agrees_with_fp32_on_the_next_token(smollm2):
    fp32, _, codec = smollm2
    bf16 = native("smollm2-135m", BackendConfig(dtype="bfloat16"))
    ids = codec.encode(PROMPT)
    low, high = bf16.new_sequence().forward(ids), fp32.new_sequence().forward(ids)
    assert low.dtype == torch.float32
    agree = (low.argmax(-1) == high.argmax(-1)).float().mean().item()
    assert agree > 0.8, agree
