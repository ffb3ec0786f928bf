"""Which llama.cpp build runs here, and whether it can run on this CPU at all, asked of a child process.

A llama.cpp library compiled for other instruction sets than this CPU's (a wheel built elsewhere and reused
from a cache, `-march=native` on a machine with AMX: docs/decisions/0001-llamacpp-build.md) does not raise:
it kills the process with SIGILL or SIGSEGV. So the first time a library file is used on a CPU, a child
process imports llama-cpp-python, reports the build (`BuildInfo`), and, given a GGUF, decodes a block of
tokens and then one token with it. The verdict is kept in `$SPEKULA_CACHE/llamacpp-check/`, under a key of
the library files and the CPU's flags, so it is asked once; a rebuilt library or another CPU is asked anew.
A child killed by a signal becomes `LlamaCppUnusable`, a `ModelError` that says how to rebuild.

Run as `python -m spekula.llamacpp_check [GGUF]`, the module is that child.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from spekula.errors import ModelError
from spekula.llamacpp_build import RECORD, enabled_features, this_cpu_flags
from spekula.models.cache import cache_dir

REBUILD = "`make setup` in a spekula checkout, or `python -m spekula.llamacpp_build install` in this environment"
CHILD_TIMEOUT_S = 600.0  # loading a large GGUF from a cold disk is slow; a hang is not a verdict
LIBRARIES = ("libggml-cpu.so", "libggml-base.so", "libllama.so")  # the files whose build the verdict is about


class LlamaCppUnusable(ModelError):
    """The installed llama.cpp library cannot run on this CPU (its test decode died by a signal)."""


@dataclass(frozen=True)
class BuildInfo:
    """What a user pastes into a crash report: the binding, ggml's version, how it was built, what it runs."""

    package_version: str  # llama-cpp-python
    ggml_version: str
    ggml_commit: str
    system_info: str  # llama.cpp's own llama_print_system_info(): the instruction sets compiled in
    built_for: str  # the key of spekula's build (llamacpp_build), or what is known when it was built otherwise
    library: str  # the llama_cpp package's lib/ folder

    def lines(self) -> list[str]:
        return [
            f"llama.cpp: llama-cpp-python {self.package_version}, ggml {self.ggml_version} ({self.ggml_commit})",
            f"  built for: {self.built_for}",
            f"  system info: {self.system_info}",
            f"  library: {self.library}",
        ]


@dataclass(frozen=True)
class Verdict:
    """A child's answer: the build it saw (None if it died first) and whether it ran, or how it died."""

    info: BuildInfo | None
    decoded: bool  # a test decode ran to the end (False when none was asked for)
    signal: str | None  # the signal that killed the child, e.g. "SIGILL"
    cached: bool = False

    @property
    def usable(self) -> bool:
        return self.signal is None


def package_dir() -> Path | None:
    """The installed llama_cpp package's folder, found without importing it (importing may be what crashes)."""
    spec = importlib.util.find_spec("llama_cpp")
    return Path(spec.origin).parent if spec and spec.origin else None


def check(gguf: str | Path | None = None, package: Path | None = None) -> Verdict:
    """The cached verdict for this package's library on this CPU, asking a child the first time.

    With `gguf`, the verdict must include a test decode of it: an import-only verdict is not enough.
    Raises LlamaCppUnusable when the child died by a signal; a child that failed otherwise (a Python error,
    an unreadable GGUF) gives no verdict to keep: the caller's own load reports that error.
    """
    package = package or package_dir()
    if package is None:  # not installed: the caller's import says which extra to install
        return Verdict(info=None, decoded=False, signal=None)
    path = verdict_path(package)
    verdict = _read(path)
    if verdict is None or (gguf is not None and verdict.usable and not verdict.decoded):
        verdict = _ask_child(package, gguf)
        if verdict is not None and (verdict.decoded or verdict.signal or gguf is None):
            _write(path, verdict)
    if verdict is not None and not verdict.usable:
        raise LlamaCppUnusable(_unusable_message(package, verdict, path))
    return verdict or Verdict(info=None, decoded=False, signal=None)


def verdict_path(package: Path) -> Path:
    """Where the verdict for this package's library files on this CPU is kept."""
    digest = hashlib.sha256()
    for name in LIBRARIES:
        lib = package / "lib" / name
        stat = lib.stat() if lib.exists() else None
        digest.update(f"{lib.resolve()}:{stat.st_size if stat else -1}:{stat.st_mtime_ns if stat else -1}\n".encode())
    digest.update(" ".join(sorted(this_cpu_flags())).encode())
    return cache_dir() / "llamacpp-check" / f"{digest.hexdigest()[:24]}.json"


def _ask_child(package: Path, gguf: str | Path | None) -> Verdict | None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    )
    command = [sys.executable, "-m", "spekula.llamacpp_check", *([str(gguf)] if gguf is not None else [])]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
    info, decoded = None, False
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            info = BuildInfo(**json.loads(line))
        decoded |= line == "decoded"
    if done.returncode < 0:
        return Verdict(info=info, decoded=False, signal=signal.Signals(-done.returncode).name)
    if done.returncode != 0 or info is None:
        return None
    return Verdict(info=info, decoded=decoded, signal=None)


def _unusable_message(package: Path, verdict: Verdict, path: Path) -> str:
    what = "loading llama-cpp-python" if verdict.info is None else "a test decode"
    built = verdict.info.built_for if verdict.info else _built_for(package)
    compiled = f" It was compiled with: {verdict.info.system_info}." if verdict.info else ""
    have = " ".join(f.lower() for f in enabled_features(this_cpu_flags())) or "none of ggml's x86 options"
    return (
        f"llama.cpp crashed with {verdict.signal} in {what} on this CPU, so it cannot run here: the library in "
        f"{package / 'lib'} was built for {built}.{compiled} This CPU has: {have}. Rebuild it for this CPU with "
        f"{REBUILD}, then run again. (This verdict is kept in {path}; a rebuilt library is tested anew.)"
    )


def _built_for(package: Path) -> str:
    """spekula's build key when the record beside the library matches it, else what is known."""
    record = build_record(package)
    if record is None and not (package / "lib" / RECORD).is_file():
        return "an unknown CPU (not built by spekula's `make`: pip's default build is -march=native)"
    if record is None:
        return "an unknown CPU (the library was replaced after spekula's build recorded it)"
    return f"{record['key']} (spekula's build, AMX off)"


def build_record(package: Path | None = None) -> dict | None:
    """The record spekula's build wrote beside the installed library (llamacpp_build.install), or None when there
    is none or the library is not the one it recorded (replaced since)."""
    package = package or package_dir()
    if package is None:
        return None
    try:
        record = json.loads((package / "lib" / RECORD).read_text())
        lib = (package / "lib" / "libggml-cpu.so").read_bytes()
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("libggml_cpu") == hashlib.sha256(lib).hexdigest() else None


def installed_patches(package: Path | None = None) -> frozenset[str]:
    """The patches (patches/llamacpp/ file names) the installed library was built with: none unless spekula's
    build recorded it."""
    record = build_record(package)
    return frozenset(record.get("patches", ())) if record else frozenset()


def _read(path: Path) -> Verdict | None:
    try:
        data = json.loads(path.read_text())
        info = BuildInfo(**data["info"]) if data["info"] else None
        return Verdict(info=info, decoded=data["decoded"], signal=data["signal"], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, verdict: Verdict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "info": asdict(verdict.info) if verdict.info else None,
        "decoded": verdict.decoded,
        "signal": verdict.signal,
    }
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _child(argv: list[str]) -> int:
    """Import llama-cpp-python, print its BuildInfo as one JSON line, then decode with the GGUF if given."""
    import ctypes

    import llama_cpp

    package = Path(llama_cpp.__file__).parent
    version = commit = "unknown"
    try:  # ggml's own version and commit: what llama.cpp source this is
        base = ctypes.CDLL(str(package / "lib" / "libggml-base.so"))
        base.ggml_version.restype = base.ggml_commit.restype = ctypes.c_char_p
        version, commit = base.ggml_version().decode(), base.ggml_commit().decode()
    except (OSError, AttributeError):
        pass
    info = BuildInfo(
        package_version=llama_cpp.__version__,
        ggml_version=version,
        ggml_commit=commit,
        system_info=llama_cpp.llama_print_system_info().decode().strip().rstrip("|").strip(),
        built_for=_built_for(package),
        library=str(package / "lib"),
    )
    print(json.dumps(asdict(info)), flush=True)
    if argv:
        llm = llama_cpp.Llama(model_path=argv[0], n_ctx=64, n_batch=16, n_threads=os.cpu_count() or 1, verbose=False)
        tokens = llm.tokenize(b"def add(a, b):\n    return a + b\n")[:8]
        llm.eval(tokens)  # a block of rows: the multi-row kernels
        llm.eval([tokens[-1]])  # one row: the one-token kernels
        print("decoded", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
