"""A llama.cpp library that cannot run on this CPU is reported with a clear error, never by a signal that
kills spekula; the build in use is reported (spekula.llamacpp_check, `spekula doctor`, `models list`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from spekula import llamacpp_check
from spekula.errors import ModelError
from spekula.llamacpp_check import LlamaCppUnusable, check

# A stand-in for llama_cpp that imports, reports a build, and dies by `signal` when asked to decode
FAKE = """
import os, signal
__version__ = "0.0.0-fake"
def llama_print_system_info():
    return b"CPU : AVX512 = 1 | AMX_INT8 = 1 | "
class Llama:
    def __init__(self, **kwargs):
        os.kill(os.getpid(), signal.{signal})
"""


def fake_package(root: Path, body: str) -> Path:
    package = root / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    for name in llamacpp_check.LIBRARIES:
        (package / "lib" / name).write_bytes(b"not a library")
    return package


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEKULA_CACHE", str(tmp_path / "cache"))


def test_a_library_that_dies_on_import_is_a_clear_error_and_the_verdict_is_kept(tmp_path, monkeypatch):
    package = fake_package(tmp_path / "site", "import ctypes\nctypes.string_at(0)\n")  # SIGSEGV on import
    with pytest.raises(LlamaCppUnusable) as caught:
        check(package=package)
    message = str(caught.value)
    assert "SIGSEGV" in message and "loading llama-cpp-python" in message
    assert "llamacpp_build install" in message and "make setup" in message
    assert isinstance(caught.value, ModelError)
    # asked once: a second check answers from the kept verdict, without a child
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a child was started again"))
    with pytest.raises(LlamaCppUnusable, match="SIGSEGV"):
        check(package=package)


def test_a_library_that_dies_in_a_test_decode_says_what_it_was_compiled_with(tmp_path):
    package = fake_package(tmp_path / "site", FAKE.format(signal="SIGILL"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert check(package=package).usable  # importing it is fine: no decode asked for
    with pytest.raises(LlamaCppUnusable) as caught:
        check(gguf, package=package)  # an import-only verdict is not enough once a GGUF is to be decoded
    message = str(caught.value)
    assert "SIGILL" in message and "a test decode" in message
    assert "AMX_INT8 = 1" in message  # what it was compiled with, from llama.cpp's own system info
    assert "not built by spekula" in message  # no build record beside the library


def test_a_child_that_fails_without_a_signal_gives_no_verdict_to_keep(tmp_path):
    package = fake_package(tmp_path / "site", "raise ImportError('broken install')\n")
    verdict = check(package=package)
    assert verdict.usable and verdict.info is None
    assert not llamacpp_check.verdict_path(package).exists()


def test_the_installed_build_is_reported_and_its_verdict_reused(tmp_path):
    pytest.importorskip("llama_cpp")
    first = check()
    assert first.usable and not first.cached
    info = first.info
    assert info.package_version == metadata.version("llama-cpp-python")
    assert info.system_info.startswith("CPU :")
    assert info.ggml_version != "unknown"
    assert check().cached
    record = Path(info.library) / "spekula-build.json"
    if record.exists():  # built by `make` (llamacpp_build install): the record names the key
        assert json.loads(record.read_text())["key"] in info.built_for


def test_the_patches_are_read_from_a_record_that_matches_the_library(tmp_path):
    """Exact mode keeps K in F16 only on a build with the split-KV patch (spekula.backends.llamacpp): the
    record beside the library says which patches it was built with, and counts only for that library."""
    package = fake_package(tmp_path, "")
    assert llamacpp_check.installed_patches(package) == frozenset()  # no record: pip's own build
    lib = (package / "lib" / "libggml-cpu.so").read_bytes()
    record = {"key": "k", "patches": ["0001-a.patch", "0003-b.patch"], "libggml_cpu": hashlib.sha256(lib).hexdigest()}
    (package / "lib" / "spekula-build.json").write_text(json.dumps(record))
    assert llamacpp_check.installed_patches(package) == {"0001-a.patch", "0003-b.patch"}
    assert "k (spekula's build" in llamacpp_check._built_for(package)
    (package / "lib" / "libggml-cpu.so").write_bytes(b"another library")  # replaced after the build
    assert llamacpp_check.installed_patches(package) == frozenset()
    assert "replaced" in llamacpp_check._built_for(package)


def test_the_backend_asks_before_it_imports_llama_cpp(tmp_path, monkeypatch):
    from spekula.backends.llamacpp import LlamaCppBackend

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")

    def unusable(path):
        raise LlamaCppUnusable(f"crashed on {path}")

    monkeypatch.setattr(llamacpp_check, "check", unusable)
    with pytest.raises(LlamaCppUnusable, match="model.gguf"):
        LlamaCppBackend(gguf)


def test_doctor_and_models_list_print_the_build(capsys):
    pytest.importorskip("llama_cpp")
    from spekula.cli import main

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp: llama-cpp-python" in out and "system info: CPU :" in out and "built for:" in out
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["llamacpp"]["usable"] is True and "CPU :" in report["llamacpp"]["system_info"]
    assert main(["models", "list"]) == 0
    assert "llama.cpp: llama-cpp-python" in capsys.readouterr().out
