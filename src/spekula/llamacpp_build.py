"""How the project builds llama-cpp-python: for the instruction sets this CPU has, never `-march=native`.

llama.cpp's default build (`GGML_NATIVE=ON`) compiles ggml with `-march=native`. That build has two
failure modes a user meets (docs/decisions/0001-llamacpp-build.md):

- on an Intel Xeon with AMX, `-march=native` compiles ggml's AMX kernels in, and they fault at run time
  (upstream llama.cpp issue 20824, PR 26954);
- pip caches the wheel by package version, not by CPU, so a wheel built on an AVX-512 machine is reused on
  an AVX2-only one that shares the cache, where it dies with SIGILL.

So `make` builds the wheel itself: `GGML_NATIVE=OFF`, each of ggml's instruction-set options switched on
exactly when `/proc/cpuinfo` lists every flag it needs, the AMX options always off, and the wheel kept
under a key of those options (`$SPEKULA_CACHE/wheels/<key>/`), never in pip's cache. A checkout whose CPU
changes gets another key, so the next `make` builds (or reuses) the wheel for the new CPU.

The build also applies patches/llamacpp/*.patch to the llama.cpp tree the sdist carries: kernels that sum a
row the same way whatever else shares its pass, which exact mode (the default) relies on
(docs/decisions/0009-exact-kernels.md). The key hashes the patches' text.

This file runs before spekula's dependencies are installed (the Makefile runs it with the system Python to
compute the key), so it imports only the standard library.

    python src/spekula/llamacpp_build.py key       # the build key of this CPU and the pinned version
    python src/spekula/llamacpp_build.py args      # the CMAKE_ARGS the build passes
    python -m spekula.llamacpp_build install       # build (or reuse) the wheel and install it
    python -m spekula.llamacpp_build server --out .venv/bin/llama-server   # llama.cpp's own server (benchmarks)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "llama-cpp-python"
# requirements/llamacpp.txt pins the version; this file is found from the repository root.
REQUIREMENT_FILE = Path(__file__).resolve().parents[2] / "requirements" / "llamacpp.txt"
# Patches to the llama.cpp the sdist vendors (paths relative to vendor/llama.cpp), applied in name order before
# the wheel is built: they make a row's logits the same bits whatever else shares its pass
# (docs/decisions/0009-exact-kernels.md). llama-server, the benchmarks' baseline, is built without them.
PATCH_DIR = Path(__file__).resolve().parents[2] / "patches" / "llamacpp"
RECORD = "spekula-build.json"  # written beside the wheel, and into the installed package's lib/ folder


@dataclass(frozen=True)
class Feature:
    """One of ggml's instruction-set options and the /proc/cpuinfo flags it needs (all of them)."""

    option: str  # the cmake option without its GGML_ prefix
    cpu_flags: tuple[str, ...]


# ggml/src/ggml-cpu/CMakeLists.txt maps each option to compiler flags: GGML_AVX512 adds -mavx512f, -cd, -vl,
# -dq and -bw, so it needs all five.
FEATURES: tuple[Feature, ...] = (
    Feature("SSE42", ("sse4_2",)),
    Feature("AVX", ("avx",)),
    Feature("F16C", ("f16c",)),
    Feature("FMA", ("fma",)),
    Feature("BMI2", ("bmi2",)),
    Feature("AVX2", ("avx2",)),
    Feature("AVX_VNNI", ("avx_vnni",)),
    Feature("AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    Feature("AVX512_VBMI", ("avx512f", "avx512vbmi")),
    Feature("AVX512_VNNI", ("avx512f", "avx512_vnni")),
    Feature("AVX512_BF16", ("avx512f", "avx512_bf16")),
)
# Never compiled in, whatever the CPU: ggml's AMX kernels fault at run time (see the module docstring).
DISABLED = ("AMX_TILE", "AMX_INT8", "AMX_BF16")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in a /proc/cpuinfo text (the kernel lists only what it enabled)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def this_cpu_flags() -> frozenset[str]:
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def enabled_features(flags: frozenset[str]) -> tuple[str, ...]:
    """The ggml options this CPU can run, in FEATURES' order."""
    return tuple(f.option for f in FEATURES if all(flag in flags for flag in f.cpu_flags))


def cmake_args(flags: frozenset[str], machine: str | None = None) -> list[str]:
    """The CMAKE_ARGS of a build for a CPU with these flags: every option explicit, none left to -march=native.

    Off x86-64 there is nothing to choose here: ggml's own defaults for that architecture apply, except that
    GGML_NATIVE stays off.
    """
    args = ["-DGGML_NATIVE=OFF"]
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return args
    on = set(enabled_features(flags))
    args += [f"-DGGML_{f.option}={'ON' if f.option in on else 'OFF'}" for f in FEATURES]
    args += [f"-DGGML_{option}=OFF" for option in DISABLED]
    return args


def pinned_version(requirement_file: Path = REQUIREMENT_FILE) -> str:
    """The version requirements/llamacpp.txt pins (`llama-cpp-python==X`)."""
    for line in requirement_file.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep and name.strip().lower() == PACKAGE:
            return version.strip()
    raise SystemExit(f"{requirement_file} pins no {PACKAGE}==VERSION line")


def build_key(version: str, args: list[str], machine: str | None = None, patches: tuple[Path, ...] = ()) -> str:
    """A build's cache key: the version, the architecture, the options switched on, a hash of all arguments and
    of the patches' text (a changed patch is a new build)."""
    on = [a[len("-DGGML_") : -len("=ON")].lower() for a in args if a.endswith("=ON")]
    hashed = hashlib.sha256(" ".join(args).encode())
    for patch in patches:
        hashed.update(patch.read_bytes())
    return "-".join([version, (machine or platform.machine()).lower(), *on, hashed.hexdigest()[:10]])


def patch_files(folder: Path = PATCH_DIR) -> tuple[Path, ...]:
    return tuple(sorted(folder.glob("*.patch")))


def apply_patch(patch: Path, root: Path) -> None:
    """Apply a unified diff (`--- a/PATH`, `+++ b/PATH`, `@@ -l,n +l,m @@` hunks) to the files under `root`, each
    hunk's n old lines checked against the source: a patch that does not fit it stops the build with the line it
    expected. Text before the first `--- ` is the patch's description."""
    lines = patch.read_text().splitlines()
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        target = root / lines[i + 1].removeprefix("+++ ").split("\t")[0].removeprefix("b/")
        source = target.read_text().split("\n")
        out: list[str] = []
        at = 0  # lines of `source` consumed
        i += 2
        while i < len(lines) and lines[i].startswith("@@ "):
            old, new = (field.lstrip("-+").split(",") for field in lines[i].split()[1:3])
            start, old_left, new_left = int(old[0]) - (int(old[1]) > 0), int(old[1]), int(new[1])
            out += source[at:start]
            at = start
            i += 1
            while old_left or new_left:
                if i >= len(lines):
                    raise SystemExit(f"{patch.name} ends inside a hunk of {target}")
                kind, text = lines[i][:1] or " ", lines[i][1:]  # an empty line: an empty context line
                if kind in (" ", "-"):  # the source must hold a context or a removed line
                    if at >= len(source) or source[at] != text:
                        raise SystemExit(f"{patch.name} does not apply to {target} at line {at + 1}: expected {text!r}")
                    at, old_left = at + 1, old_left - 1
                if kind in (" ", "+"):
                    out.append(text)
                    new_left -= 1
                i += 1
        target.write_text("\n".join(out + source[at:]))


def cache_root() -> Path:
    return Path(os.environ.get("SPEKULA_CACHE") or Path.home() / ".cache" / "spekula")


def wheel_dir(key: str) -> Path:
    return cache_root() / "wheels" / key


def _pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args], check=True, env=env)


def _sdist(python: str, version: str) -> Path:
    """The pinned version's sdist, downloaded once into the cache (it carries the llama.cpp tree it binds)."""
    sdist = cache_root() / "sdist" / f"{PACKAGE.replace('-', '_')}-{version}.tar.gz"
    if not sdist.is_file():
        _pip(python, "download", "--quiet", "--no-deps", "--no-binary", ":all:", "-d", str(sdist.parent),
             f"{PACKAGE}=={version}")  # fmt: skip
    return sdist


def _unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    return into / sdist.name.removesuffix(".tar.gz")


def build_wheel(python: str, version: str, args: list[str], out: Path, patches: tuple[Path, ...] = ()) -> Path:
    """Compile the wheel from the sdist, its llama.cpp patched, with these CMAKE_ARGS into `out` (pip's cache
    untouched)."""
    env = dict(os.environ, CMAKE_ARGS=" ".join(args), FORCE_CMAKE="1")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    env.pop("SOURCE_DATE_EPOCH", None)  # irrelevant with explicit options, but keep ggml's defaults predictable
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        source = _unpack(_sdist(python, version), Path(tmp))
        for patch in patches:
            apply_patch(patch, source / "vendor" / "llama.cpp")
        names = ", ".join(p.name for p in patches) or "none"
        print(f"spekula: building {PACKAGE}=={version} for this CPU ({' '.join(args)}; patches: {names}); a few "
              "minutes", flush=True)  # fmt: skip
        _pip(python, "wheel", "--quiet", "--no-deps", "--no-cache-dir", "-w", tmp, str(source), env=env)
        (built,) = Path(tmp).glob("*.whl")
        return built.replace(out / built.name)


def install(python: str = sys.executable, requirement_file: Path = REQUIREMENT_FILE) -> Path:
    """Build the wheel for this CPU unless the cache holds it, install it into `python`'s environment."""
    version = pinned_version(requirement_file)
    flags = this_cpu_flags()
    args = cmake_args(flags)
    patches = patch_files()
    key = build_key(version, args, patches=patches)
    folder = wheel_dir(key)
    wheels = sorted(folder.glob("*.whl"))
    wheel = wheels[-1] if wheels else build_wheel(python, version, args, folder, patches)
    record = {
        "package": PACKAGE,
        "version": version,
        "key": key,
        "cmake_args": args,
        "features": list(enabled_features(flags)),
        "disabled": list(DISABLED),
        "patches": [p.name for p in patches],
        "wheel": wheel.name,
    }
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    _pip(python, "install", "--quiet", "--force-reinstall", "--no-deps", str(wheel))
    _pip(python, "install", "--quiet", str(wheel))  # its dependencies, where missing
    lib = _installed_lib(python)
    lib_record = dict(record, libggml_cpu=_file_identity(lib / "libggml-cpu.so"))
    (lib / RECORD).write_text(json.dumps(lib_record, indent=1) + "\n")
    print(f"spekula: {PACKAGE} {version} installed, built for {key}", flush=True)
    return wheel


def _installed_lib(python: str) -> Path:
    code = "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent)"
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    return Path(out) / "lib"


def _file_identity(path: Path) -> str:
    """What tells one build of a library from another: its SHA-256 (the record is trusted only if it matches)."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


# llama.cpp's own server, for benchmarks only: a static binary from the same sdist, with the same options, no
# network at build time (no prebuilt web UI download, no HTTPS).
SERVER_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
]


def build_server(python: str, out: Path, requirement_file: Path = REQUIREMENT_FILE) -> Path:
    """llama-server from the llama.cpp that the pinned llama-cpp-python vendors, built for this CPU with the
    wheel's options, kept under the same key in $SPEKULA_CACHE/llama-server/ and copied to `out`."""
    version = pinned_version(requirement_file)
    args = cmake_args(this_cpu_flags())
    binary = cache_root() / "llama-server" / build_key(version, args) / "llama-server"
    if not binary.is_file():
        sdist = _sdist(python, version)
        binary.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=binary.parent) as tmp:
            source = _unpack(sdist, Path(tmp)) / "vendor" / "llama.cpp"
            build = Path(tmp) / "build"
            print(f"spekula: building llama-server from {sdist.name} ({' '.join(args)}); ~10 minutes", flush=True)
            subprocess.run(["cmake", "-S", str(source), "-B", str(build), *SERVER_ARGS, *args], check=True)
            jobs = str(os.cpu_count() or 1)
            subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], check=True)
            (build / "bin" / "llama-server").replace(binary)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, out)
    print(f"spekula: llama-server ({PACKAGE} {version}'s llama.cpp, built for this CPU) at {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamacpp_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("key", "args", "install", "server"))
    parser.add_argument("--python", default=sys.executable, help="the environment to install into (install)")
    parser.add_argument("--out", type=Path, help="where to put the llama-server binary (server)")
    args = parser.parse_args(argv)
    if args.command == "install":
        install(args.python)
        return 0
    if args.command == "server":
        build_server(args.python, args.out or Path(args.python).parent / "llama-server")
        return 0
    cmake = cmake_args(this_cpu_flags())
    print(build_key(pinned_version(), cmake, patches=patch_files()) if args.command == "key" else " ".join(cmake))
    return 0


if __name__ == "__main__":
    sys.exit(main())
