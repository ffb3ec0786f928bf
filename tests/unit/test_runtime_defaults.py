"""Which runtime runs the target and the draft when the user does not say."""

import argparse
import importlib.util

import pytest

from spekula.config import BackendConfig
from spekula.options import add_model_options, draft_backend_from_args
from spekula.pipeline import DEFAULT_RUNTIME, default_draft_runtime, draft_backend_config

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_model_options(p)
    return p.parse_args(list(argv))


def test_the_cli_target_runs_native_by_default():
    assert DEFAULT_RUNTIME == "native" and parse().backend == "native"


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is installed by `make setup`")
def test_a_builtin_draft_runs_in_llama_cpp_unless_told_otherwise():
    assert default_draft_runtime("qwen2.5-coder-0.5b", "native") == "llamacpp"
    assert default_draft_runtime("qwen2.5-coder-0.5b", "transformers") == "llamacpp"
    assert default_draft_runtime("/models/draft.gguf", "native") == "llamacpp"
    config = draft_backend_from_args(parse("--dtype", "bfloat16", "--threads", "1"))
    assert config == BackendConfig(dtype="float32", threads=1, runtime="llamacpp")  # llama.cpp: the GGUF's own types


def test_what_has_no_gguf_runs_like_the_target(tmp_path):
    assert default_draft_runtime(str(tmp_path), "native") == "native"  # a Hugging Face directory
    assert default_draft_runtime("ngram", "native") == "native"  # no draft model at all
    assert default_draft_runtime("none", "transformers") == "transformers"
    assert default_draft_runtime("qwen2.5-coder-0.5b", "llamacpp") == "llamacpp"
    explicit = draft_backend_from_args(parse("--draft-backend", "transformers", "--dtype", "bfloat16"))
    assert explicit == BackendConfig(dtype="bfloat16", runtime="transformers")
    assert draft_backend_config("ngram", BackendConfig(dtype="bfloat16", runtime="native")).dtype == "bfloat16"
