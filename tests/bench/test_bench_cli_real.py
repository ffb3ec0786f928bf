"""`spekula bench | tune | audit` end to end through the CLI on a real (tiny, randomly initialised) Llama
with SmolLM2's tokenizer and chat template (so the smollm2-135m cache is needed: marked `model`):
loading, chat templates, manifests with hashes, the docs hand-off, and the config file that
`spekula generate --config` reads back."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from spekula.cli import main

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from spekula.models import resolve

    source = resolve("smollm2-135m").hf_dir
    folder = tmp_path_factory.mktemp("tiny-llama")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]), "\n".join(out)


def test_bench_cli(tiny_llama, tmp_path, capsys):
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text(
        "# Benchmarks\n\nintro\n\n<!-- spekula bench: begin -->\nstale-table\n<!-- spekula bench: end -->\n\nafter\n"
    )
    rc = main(
        [
            "bench",
            "--target",
            tiny_llama,
            "--spec",
            f"draft={tiny_llama},k=2/3",
            "--spec",
            "draft=ngram,k=3",
            "--categories",
            "code-editing,open-chat",
            "--per-category",
            "1",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--out",
            str(tmp_path / "out"),
            "--markdown-into",
            str(docs),
            "--no-progress",
        ]
    )
    assert rc == 0
    line, text = last_json(capsys)
    name = tiny_llama.rsplit("/", 1)[-1]
    assert list(line["configs"]) == ["plain", f"{name} k=2", f"{name} k=3", "ngram k=3"]
    for c in line["configs"].values():
        assert c["identical"] == c["compared"] == 2 and c["errors"] == 0
    assert line["configs"][f"{name} k=3"]["alpha"] == 1.0  # the draft is the target itself
    result = json.loads(open(line["results"]).read())
    target = result["manifest"]["models"][0]
    assert target["role"] == "target" and re.fullmatch(r"[0-9a-f]{64}", target["sha256"])
    assert result["manifest"]["config"]["max_tokens"] == 6
    updated = docs.read_text()
    assert "stale-table" not in updated and "intro" in updated and "after" in updated and f"| {name} k=2 |" in updated
    assert "![Speedup over plain decoding" in updated
    assert "## spekula bench" in text


def test_tune_writes_a_config_generate_accepts(tiny_llama, tmp_path, capsys):
    config = tmp_path / "tuned.json"
    rc = main(
        [
            "tune",
            "--target",
            tiny_llama,
            "--drafts",
            f"{tiny_llama},ngram",
            "--ks",
            "2",
            "--sample",
            "2",
            "--max-tokens",
            "6",
            "--out",
            str(tmp_path / "out"),
            "--write-config",
            str(config),
            "--no-progress",
        ]
    )
    assert rc == 0
    line, text = last_json(capsys)
    assert line["kind"] == "spekula-tune" and "recommended:" in text
    values = json.loads(config.read_text())
    assert values["target"] == tiny_llama and values == line["config"]
    rc = main(["generate", "hello", "--config", str(config), "--max-tokens", "4", "--json"])
    assert rc == 0
    out, _ = last_json(capsys)
    assert out["config"]["target"] == tiny_llama and out["config"]["draft"] == values["draft"]


def test_audit_cli(tiny_llama, tmp_path, capsys):
    rc = main(
        [
            "audit",
            "--target",
            tiny_llama,
            "--spec",
            f"draft={tiny_llama},k=2",
            "--spec",
            "draft=ngram,k=2",
            "--categories",
            "open-chat",
            "--per-category",
            "2",
            "--max-tokens",
            "6",
            "--samples",
            "60",
            "--positions",
            "2",
            "--dist-prompts",
            "1",
            "--temperature",
            "1",
            "--top-k",
            "5",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    line, text = last_json(capsys)
    assert rc == 0 and line["passed"] is True, text
    saved = json.loads(open(line["results"]).read())
    assert len(saved["greedy"]) == 4 and len(saved["distribution"]) == 4
    assert saved["manifest"]["seeds"]["distribution"]["base"] == 1
