"""Which runtime runs the target and the draft when the user does not say."""

import argparse
import importlib.util

import pytest

from spekula.config import BackendConfig
from spekula.options import add_model_options, backend_from_args, draft_backend_from_args, resolve_draft
from spekula.pipeline import DEFAULT_DRAFT, default_draft, default_draft_runtime, default_runtime, draft_backend_config

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_model_options(p)
    return p.parse_args(list(argv))


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is installed by `make setup`")
def test_a_gguf_target_on_a_cpu_runs_in_llama_cpp_and_so_does_its_draft():
    assert default_runtime("qwen2.5-coder-1.5b", device="cpu") == "llamacpp"  # a built-in model: a GGUF
    assert default_runtime("/models/target.GGUF", device="cpu") == "llamacpp"
    args = parse("--target", "qwen2.5-coder-1.5b", "--threads", "2")
    assert args.backend is None  # the option records that nobody chose; backend_from_args decides
    if not _sees_gpu():
        assert backend_from_args(args) == BackendConfig(threads=2, runtime="llamacpp")
        assert draft_backend_from_args(args) == BackendConfig(threads=2, runtime="llamacpp", exact=False)


def test_native_on_a_gpu_for_a_hugging_face_directory_or_without_llama_cpp(tmp_path, monkeypatch):
    assert default_runtime("qwen2.5-coder-1.5b", device="cuda") == "native"
    assert default_runtime(str(tmp_path), device="cpu") == "native"  # a Hugging Face directory: no GGUF
    assert default_runtime("qwen2.5-coder-1.5b", device="cpu", dtype="bfloat16") == "native"  # PyTorch weights
    assert backend_from_args(parse("--dtype", "bfloat16")).runtime == "native"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # as if llama-cpp-python were missing
    assert default_runtime("qwen2.5-coder-1.5b", device="cpu") == "native"


def test_an_explicit_backend_always_wins():
    for runtime in ("native", "transformers", "llamacpp"):
        args = parse("--backend", runtime, "--target", "qwen2.5-coder-1.5b")
        assert backend_from_args(args).runtime == runtime
    assert draft_backend_from_args(parse("--backend", "native", "--draft-backend", "native")).runtime == "native"


def _sees_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is installed by `make setup`")
def test_a_builtin_draft_runs_in_llama_cpp_unless_told_otherwise():
    assert default_draft_runtime("qwen2.5-coder-0.5b", "native") == "llamacpp"
    assert default_draft_runtime("qwen2.5-coder-0.5b", "transformers") == "llamacpp"
    assert default_draft_runtime("/models/draft.gguf", "native") == "llamacpp"
    config = draft_backend_from_args(parse("--dtype", "bfloat16", "--threads", "1"))
    assert config == BackendConfig(dtype="float32", threads=1, runtime="llamacpp", exact=False)  # the GGUF's types


def test_what_has_no_gguf_runs_like_the_target(tmp_path):
    assert default_draft_runtime(str(tmp_path), "native") == "native"  # a Hugging Face directory
    assert default_draft_runtime("ngram", "native") == "native"  # no draft model at all
    assert default_draft_runtime("none", "transformers") == "transformers"
    assert default_draft_runtime("qwen2.5-coder-0.5b", "llamacpp") == "llamacpp"
    explicit = draft_backend_from_args(parse("--draft-backend", "transformers", "--dtype", "bfloat16"))
    assert explicit == BackendConfig(dtype="bfloat16", runtime="transformers", exact=False)
    assert draft_backend_config("ngram", BackendConfig(dtype="bfloat16", runtime="native")).dtype == "bfloat16"


def test_the_default_proposer_follows_the_targets_runtime():
    assert default_draft("llamacpp") == "suffix"  # every verified row costs there: only free drafting can pay
    assert default_draft("native") == default_draft("transformers") == DEFAULT_DRAFT
    args = parse("--backend", "native")
    resolve_draft(args)
    assert args.draft == DEFAULT_DRAFT
    args = parse("--backend", "llamacpp")
    resolve_draft(args)
    assert args.draft == "suffix"
    args = parse("--backend", "llamacpp", "--draft", "ngram")  # an explicit --draft always wins
    resolve_draft(args)
    assert args.draft == "ngram"
