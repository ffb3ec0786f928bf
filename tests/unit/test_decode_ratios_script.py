"""scripts/decode_ratios.py: whole-request and decode-only ratios against the baseline's same prompt."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "decode_ratios.py"


def request(config: str, prompt: str, speedup: float, tokens: int, total_s: float, prefill_s: float) -> dict:
    return {
        "config": config, "prompt_id": prompt, "category": prompt.rsplit("-", 1)[0], "repeat": 0, "error": None,
        "speedup": speedup, "stats": {"output_tokens": tokens, "total_s": total_s, "prefill_s": prefill_s, "k_chosen": {"0": tokens}},
    }


def test_decode_only_ratio_leaves_the_prefill_out():
    spec = importlib.util.spec_from_file_location("decode_ratios", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = {"baseline": "plain", "requests": [
        request("plain", "chat-01", 1.0, 10, 15.0, 5.0),  # decodes 10 tokens in 10 s
        request("ngram", "chat-01", 0.8, 10, 18.0, 10.0),  # a slower prefill, but 10 tokens in 8 s
    ]}
    cell = module.ratios(result)["ngram"]["chat"]
    assert cell["whole"] == [0.8]
    assert cell["decode"] == [pytest.approx(1.25)]
    result["requests"].append(request("plain", "chat-02", 1.0, 30, 21.0, 1.0))  # 30 tokens in 20 s
    pooled = module.pooled_decode(result)["chat"]
    assert pooled["plain"] == pytest.approx(40 / 30) and pooled["ngram"] == pytest.approx(10 / 8)
