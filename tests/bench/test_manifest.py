"""What a result file records names no machine: spekula.bench.manifest.portable_path and portable."""

from __future__ import annotations

import sys

import pytest

from spekula.bench import manifest


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A checkout, a model cache and a home folder of their own, each somewhere under tmp_path."""
    checkout, cache, home = tmp_path / "checkout", tmp_path / "home" / "cache", tmp_path / "home"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text("")
    monkeypatch.setattr(manifest, "CHECKOUT", checkout)
    monkeypatch.setenv("SPEKULA_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(home))
    return checkout, cache, home


def test_paths_are_written_from_the_checkout_the_cache_or_home(places):
    checkout, cache, home = places
    assert manifest.portable_path(str(checkout / ".venv" / "bin" / "python")) == ".venv/bin/python"
    assert manifest.portable_path(str(checkout)) == "."
    assert manifest.portable_path(str(cache / "hf" / "qwen")) == "$SPEKULA_CACHE/hf/qwen"  # before home, which holds it
    assert manifest.portable_path(str(home / "models" / "m.gguf")) == "~/models/m.gguf"
    assert manifest.portable_path(f"--out={checkout / 'runs' / 'a'}") == "--out=runs/a"


@pytest.mark.parametrize("text", ["/v1/models", "draft=suffix,k=auto", "qwen2.5-coder-1.5b", "runs/a", "--k=3", ""])
def test_text_that_is_no_path_of_this_machine_is_left_as_it_is(places, text):
    assert manifest.portable_path(text) == text


def test_a_manifest_records_the_command_models_and_config_portably(places, monkeypatch):
    checkout, cache, _ = places
    monkeypatch.setattr(sys, "argv", [str(checkout / "src" / "spekula" / "__main__.py"), "bench", "--out", "/tmp/x"])
    monkeypatch.setattr(manifest, "machine", lambda: {"llamacpp": {"library": str(checkout / ".venv" / "lib")}})
    models = [{"role": "target", "path": str(cache / "hf" / "qwen")}]
    m = manifest.manifest(models=models, config={"out": checkout / "runs", "k": 3}, seeds={})
    assert m["command"] == ["src/spekula/__main__.py", "bench", "--out", "/tmp/x"]
    assert m["models"][0]["path"] == "$SPEKULA_CACHE/hf/qwen"
    assert m["config"] == {"out": "runs", "k": 3}
    assert m["machine"]["llamacpp"]["library"] == ".venv/lib"
