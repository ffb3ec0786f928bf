"""`spekula doctor`: what runs here, in lines a user can paste into a report.

The machine (CPU, the instruction sets ggml can use, AMX), the versions, the llama.cpp build in use (its
version, what it was built for, llama.cpp's own system-info string) and whether it decodes on this CPU:
a test decode of the smallest installed GGUF in a child process (spekula.llamacpp_check), kept per
library file and CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict
from importlib import metadata
from typing import Any

from spekula.errors import SpekulaError
from spekula.llamacpp_build import enabled_features, this_cpu_flags
from spekula.llamacpp_check import check, package_dir


def register(subparsers: Any) -> dict[str, argparse.ArgumentParser]:
    p = subparsers.add_parser("doctor", help="print the machine, the versions and the llama.cpp build in use")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=_doctor)
    return {"doctor": p}


def report() -> dict[str, Any]:
    """Everything `spekula doctor` prints, as one JSON-able dict."""
    flags = this_cpu_flags()
    out: dict[str, Any] = {
        "spekula": _version("spekula"),
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "cpu": {
            "model": _cpu_model(),
            "machine": platform.machine(),
            "ggml_features": [f.lower() for f in enabled_features(flags)],
            "amx": sorted(f for f in flags if f.startswith("amx")),
        },
        "llamacpp": None,
    }
    if package_dir() is None:
        return out
    gguf = _smallest_gguf()
    try:
        verdict = check(gguf)
    except SpekulaError as e:  # the crash report is the answer here, not an error of this command
        out["llamacpp"] = {"usable": False, "error": str(e)}
        return out
    out["llamacpp"] = {
        **(asdict(verdict.info) if verdict.info else {}),
        "usable": verdict.usable,
        "test_decode": str(gguf) if verdict.decoded else None,
    }
    return out


def _doctor(args: argparse.Namespace) -> int:
    out = report()
    if args.json:
        print(json.dumps(out))
        return 0
    cpu = out["cpu"]
    print(f"spekula {out['spekula']}, Python {out['python']}, torch {out['torch']}")
    print(f"CPU: {cpu['model']} ({cpu['machine']}); ggml can use: {' '.join(cpu['ggml_features']) or 'none'}")
    print(f"  AMX: {' '.join(cpu['amx']) or 'no'} (never compiled in: docs/decisions/0001-llamacpp-build.md)")
    llama = out["llamacpp"]
    if llama is None:
        print("llama.cpp: not installed (pip install 'spekula[llamacpp]', or `make setup`)")
        return 0
    if not llama["usable"]:
        print(f"llama.cpp: UNUSABLE on this CPU: {llama.get('error')}")
        return 1
    print(f"llama.cpp: llama-cpp-python {llama['package_version']}, ggml {llama['ggml_version']} "
          f"({llama['ggml_commit']})")  # fmt: skip
    print(f"  built for: {llama['built_for']}")
    print(f"  system info: {llama['system_info']}")
    print(f"  library: {llama['library']}")
    decoded = llama["test_decode"]
    print(f"  test decode on this CPU: {'ok, ' + decoded if decoded else 'not run (no GGUF installed)'}")
    return 0


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _smallest_gguf():
    """The smallest verified built-in GGUF, for the test decode (None when none is installed)."""
    from spekula.models import list_models, resolve

    ready = sorted((s.gguf_size, s.name) for s in list_models() if s.verified)
    return resolve(ready[0][1]).gguf_path if ready else None
