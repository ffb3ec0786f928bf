"""fetch, resolve, list_models: turn a model name or path into files on disk.

fetch is the only function that may reach the network (pip). resolve uses what is installed
and cached: a catalogue model whose packages are installed is assembled and converted on first
use, one whose packages are missing is refused with the commands that fix it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spekula.errors import ModelError
from spekula.models import packages
from spekula.models.assemble import assemble
from spekula.models.cache import (
    build_dir,
    cache_dir,
    file_sha256,
    gguf_dir,
    hash_file,
    hf_ready,
    hf_root,
    record_sha256,
    recorded_sha256,
)
from spekula.models.catalogue import CATALOGUE, CatalogueEntry
from spekula.models.convert import convert_gguf

Report = Callable[[str], None]


def _silent(message: str) -> None:
    pass


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    hf_dir: Path  # loads with AutoModelForCausalLM.from_pretrained / AutoTokenizer.from_pretrained
    gguf_path: Path | None  # for llama.cpp; None for a model given as a Hugging Face directory
    sha256: str | None  # of the GGUF, when there is one


@dataclass(frozen=True)
class ModelStatus:
    name: str
    parameters: int
    gguf_size: int
    licence: str
    installed: bool  # every pinned package present at its version
    verified: bool  # the assembled GGUF is in the cache and its recorded hash is the expected one
    converted: bool  # the Hugging Face directory is ready


def fetch(name: str, report: Report = _silent) -> ResolvedModel:
    """Install (if needed), assemble, verify and convert a catalogue model; nothing when already done."""
    return _materialise(_entry(name), report, may_install=True)


def resolve(name_or_path: str | Path, report: Report = _silent) -> ResolvedModel:
    """A catalogue name, a Hugging Face model directory, or a .gguf file; never touches the network.

    A catalogue name wins over a same-named relative path; write ./name for the path.
    """
    if isinstance(name_or_path, str) and name_or_path in CATALOGUE:
        return _materialise(CATALOGUE[name_or_path], report, may_install=False)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is a directory but not a Hugging Face model directory (it has no config.json).")
        return ResolvedModel(name=path.resolve().name, hf_dir=path.resolve(), gguf_path=None, sha256=None)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _from_gguf_file(path.resolve(), report)
    raise ModelError(
        f"Unknown model {str(name_or_path)!r}: not a built-in model, a Hugging Face model directory or a .gguf file. "
        f"Built-in models: {', '.join(CATALOGUE)} (see `spekula models list`)."
    )


def list_models() -> list[ModelStatus]:
    """One row per catalogue entry; cheap: trusts the records, hashes nothing."""
    rows = []
    for entry in CATALOGUE.values():
        gguf = gguf_dir() / entry.gguf_file
        rows.append(
            ModelStatus(
                name=entry.name,
                parameters=entry.parameters,
                gguf_size=entry.gguf_size,
                licence=entry.licence,
                installed=not packages.missing(entry.dists),
                verified=recorded_sha256(gguf, _record(gguf)) == entry.sha256,
                converted=hf_ready(hf_root() / entry.name, entry.sha256),
            )
        )
    return rows


def fetch_command(name: str) -> str:
    return f"spekula models fetch {name}"


def _entry(name: str) -> CatalogueEntry:
    if name not in CATALOGUE:
        raise ModelError(f"Unknown model {name!r}. Built-in models: {', '.join(CATALOGUE)}.")
    return CATALOGUE[name]


def _record(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".json")


def _materialise(entry: CatalogueEntry, report: Report, may_install: bool) -> ResolvedModel:
    gguf = gguf_dir() / entry.gguf_file
    if not _gguf_verified(gguf, entry.sha256):
        absent = packages.missing(entry.dists)
        if absent and not may_install:
            raise ModelError(
                f"Model {entry.name!r} is not fetched: its packages are missing "
                f"({packages.describe_missing(absent)}).\n"
                f"Fetch it with:\n  {fetch_command(entry.name)}\n"
                f"or install its packages yourself, then run again:\n"
                f"  {packages.shell_line(packages.pip_command(entry.dists))}"
            )
        if absent:
            packages.install(absent, report)
        size = f"{entry.gguf_size / 1e6:.0f} MB"
        report(f"{entry.name}: assembling {entry.gguf_file} ({size}) from {len(entry.parts)} part(s)")
        start = time.perf_counter()
        assemble(_part_paths(entry), gguf, entry.sha256, fix_hint=_reinstall_hint(entry))
        record_sha256(gguf, _record(gguf), entry.sha256, built_from=[d.requirement for d in entry.dists])
        report(f"{entry.name}: {gguf} assembled and verified in {time.perf_counter() - start:.1f} s")
    hf = hf_root() / entry.name
    if not hf_ready(hf, entry.sha256):
        _convert(gguf, hf, entry.sha256, entry.chat_template, report)
    return ResolvedModel(name=entry.name, hf_dir=hf, gguf_path=gguf, sha256=entry.sha256)


def _gguf_verified(gguf: Path, expected: str) -> bool:
    """Trust a valid record; hash a file that has none once (e.g. a record deleted by hand)."""
    if recorded_sha256(gguf, _record(gguf)) == expected:
        return True
    if gguf.is_file() and hash_file(gguf) == expected:
        record_sha256(gguf, _record(gguf), expected)
        return True
    return False


def _part_paths(entry: CatalogueEntry) -> list[Path]:
    paths = []
    for part in entry.parts:
        root = packages.locate(part.package)
        if root is None:
            raise ModelError(
                f"Package {part.package} of model {entry.name!r} is recorded as installed but cannot be found "
                f"on this interpreter's path. {_reinstall_hint(entry)}"
            )
        paths.append(root / part.path)
    return paths


def _reinstall_hint(entry: CatalogueEntry) -> str:
    return f"Reinstall the pinned packages:\n  {packages.shell_line(packages.pip_command(entry.dists, reinstall=True))}"


def _from_gguf_file(path: Path, report: Report) -> ResolvedModel:
    """A user's GGUF: hashed once (record kept in the cache), converted once per distinct content."""
    key = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    sha = file_sha256(path, cache_dir() / "hashes" / f"{key}.json")
    hf = hf_root() / f"gguf-{sha[:16]}"
    if not hf_ready(hf, sha):
        _convert(path, hf, sha, require_chat_template=False, report=report)
    return ResolvedModel(name=path.stem, hf_dir=hf, gguf_path=path, sha256=sha)


def _convert(gguf: Path, hf: Path, sha: str, require_chat_template: bool, report: Report) -> None:
    marker = {
        "source_sha256": sha,
        "source": str(gguf),
        "transformers": packages.installed_version("transformers"),
        "dtype": "bfloat16",
    }
    start = time.perf_counter()
    build_dir(hf, marker, lambda out: convert_gguf(gguf, out, require_chat_template, report))
    report(f"converted to {hf} in {time.perf_counter() - start:.1f} s")
