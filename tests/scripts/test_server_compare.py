"""scripts/server_compare.sh without starting a server: it parses, documents every knob it reads, refuses a missing
model before starting anything, and passes only options that spekula and llama_cpp.server have."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "server_compare.sh"
TEXT = SCRIPT.read_text()


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, **kwargs)


def help_of(*command: str) -> str:
    result = subprocess.run([sys.executable, "-m", *command, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_help_documents_every_environment_knob_the_script_reads():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("server_compare.sh: spekula serve against llama-cpp-python")
    assert "set -euo" not in result.stdout and "#" not in result.stdout.splitlines()[0]
    knobs = set(re.findall(r"^([A-Z_]+)=\$\{\1:-", TEXT, flags=re.M))
    assert {"CONCURRENCIES", "PER_CATEGORY", "MAX_TOKENS", "THREADS", "N_CTX"} <= knobs
    for knob in knobs:
        assert re.search(rf"\b{knob} \[", result.stdout), f"{knob} is read but not documented in --help"


def test_without_an_out_dir_it_prints_usage_and_fails():
    result = run()
    assert result.returncode == 2 and "OUT_DIR" in result.stderr


def test_a_missing_gguf_fails_before_any_server_starts(tmp_path):
    result = run(str(tmp_path / "out"), str(tmp_path / "no-such-model.gguf"))
    assert result.returncode != 0
    assert f"no GGUF at {tmp_path / 'no-such-model.gguf'}" in result.stderr
    assert not (tmp_path / "out" / "spekula-serve.log").exists()


def test_it_passes_only_options_spekula_has():
    serve, bench = help_of("spekula", "serve"), help_of("spekula", "bench")
    for flag in ("--target", "--threads", "--draft", "--host", "--port"):
        assert flag in serve
    for flag in ("--endpoint", "--baseline-endpoint", "--baseline-extra-body", "--per-category", "--requests"):
        assert flag in TEXT and flag in bench


def test_it_passes_only_options_llama_cpp_server_has():
    for module in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings"):
        pytest.importorskip(module)
    text = help_of("llama_cpp.server")
    line = next(x for x in TEXT.splitlines() if x.strip().startswith("llama=(-m llama_cpp.server"))
    following = TEXT[TEXT.index(line) :].split("\n", 2)[:2]
    flags = set(re.findall(r"(--[a-z_]+)", "\n".join(following)))
    assert {"--n_ctx", "--n_threads", "--n_threads_batch", "--interrupt_requests"} <= flags
    for flag in flags:
        assert f"[{flag} " in text, f"llama_cpp.server has no {flag}"
