"""What a result file needs to be reproduced: models and their hashes, packages, machine, config, seeds, commit."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from spekula.extras import needs_extra
from spekula.hugepages import thp_mode

PACKAGES = (
    "spekula",
    "torch",
    "transformers",
    "numpy",
    "scipy",
    "safetensors",
    "tokenizers",
    "openai",
    "httpx",
    "tqdm",
    "matplotlib",
    "psutil",
)
# The checkout spekula runs from (src/spekula/bench/manifest.py), where it runs from one: paths under it are
# written relative to it.
CHECKOUT = Path(__file__).resolve().parents[3]


def portable(value: Any) -> Any:
    """value with every path of this machine written so that it names no machine (portable_path), through
    lists, tuples and dicts; anything else as it is. What a result file records goes through it."""
    if isinstance(value, str):
        return portable_path(value)
    if isinstance(value, Path):
        return portable_path(str(value))
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    return value


def portable_path(text: str) -> str:
    """An absolute path under the checkout relative to it (`.venv/bin/python`), under the model cache from
    `$SPEKULA_CACHE/`, under the home folder from `~/`; a `--flag=PATH` keeps its flag. Any other text, and a
    path elsewhere (`/tmp/...`), as it is."""
    if not os.path.isabs(text):
        flag, equals, rest = text.partition("=")
        return f"{flag}={portable_path(rest)}" if equals and os.path.isabs(rest) else text
    from spekula.models.cache import cache_dir

    path = Path(text)
    checkout = CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else None
    for base, name in ((checkout, ""), (cache_dir(), "$SPEKULA_CACHE"), (Path.home(), "~")):
        if base is None or not path.is_relative_to(base):
            continue
        inside = path.relative_to(base)
        if not name:
            return str(inside)  # "." for the checkout itself
        return name if inside == Path(".") else f"{name}/{inside}"
    return text


def model_identity(name: str, role: str) -> dict[str, Any]:
    """Name, SHA-256 and where the weights lie, for a catalogue name or a path. Never raises."""
    info: dict[str, Any] = {"role": role, "name": name, "sha256": None, "path": None}
    try:
        from spekula.models import resolve

        resolved = resolve(name)
        info.update(name=resolved.name, sha256=resolved.sha256, path=str(resolved.hf_dir))
        if resolved.sha256 is None:  # a user's Hugging Face directory: hash its weight files
            info["sha256"] = weights_sha256(Path(resolved.hf_dir))
            info["sha256_of"] = "weight files (*.safetensors / *.bin, sorted by name)"
        else:
            info["sha256_of"] = "GGUF file"
    except Exception as e:  # the manifest describes; it must not stop a finished run
        info["error"] = f"{type(e).__name__}: {e}"[:200]
    return info


def weights_sha256(folder: Path) -> str | None:
    import hashlib

    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        return None
    h = hashlib.sha256()
    for p in files:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def machine() -> dict[str, Any]:
    with needs_extra("bench", "the manifest's machine description"):
        import psutil

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "gpu": None,
        "cpu_flags": cpu_flags(),
        # the page size the weights sit on (spekula.hugepages): THP mode, and whether malloc asks for huge pages
        "huge_pages": {"thp": thp_mode(), "glibc_tunables": os.environ.get("GLIBC_TUNABLES")},
        "llamacpp": llamacpp_build(),
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return info


def llamacpp_build() -> dict[str, Any] | None:
    """The llama.cpp build in use (spekula.llamacpp_check: version, what it was built for, its system info)."""
    from dataclasses import asdict

    from spekula.llamacpp_check import check

    try:
        info = check().info
    except Exception as e:  # the manifest describes; it must not stop a finished run
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    return asdict(info) if info else None


# the vector extensions a CPU decoding pass's speed depends on (the physics differ by machine: check them)
KERNEL_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpuinfo(field: str) -> str | None:
    """The first value /proc/cpuinfo gives `field` ("model name", "flags"); None off Linux."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> list[str]:
    """Which of KERNEL_FLAGS /proc/cpuinfo lists ([] off Linux)."""
    present = set((cpuinfo("flags") or "").split())
    return [flag for flag in KERNEL_FLAGS if flag in present]


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def packages() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> dict[str, Any]:
    """The commit of the checkout spekula runs from (read-only git commands); None when not a checkout."""
    root = CHECKOUT
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {"commit": None}
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None}


def manifest(
    *, models: list[dict[str, Any]], config: dict[str, Any], seeds: dict[str, Any], memory: dict[str, Any] | None = None
) -> dict[str, Any]:
    """memory: the proposer memory the figures are for (results.result_dict's), where the run says. Paths of
    this machine (the command's, the models', the llama.cpp library's) are written portably (portable)."""
    return {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": portable(sys.argv),
        "models": portable(models),
        "packages": packages(),
        "machine": portable(machine()),
        "config": portable(config),
        "seeds": seeds,
        "proposer_memory": memory,
        "git": git_commit(),
    }
