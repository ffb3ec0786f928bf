"""The cache directory, and the small JSON records that let a second run do nothing.

Layout under cache_dir() ($SPEKULA_CACHE if set, else ~/.cache/spekula):

    gguf/<file>.gguf          an assembled GGUF, written under a temporary name and renamed when verified
    gguf/<file>.gguf.json     its record: size, mtime_ns, sha256 and the packages it was built from
    hashes/<key>.json         the record of a user's GGUF outside the cache (key: hash of its absolute path)
    hf/<name>/                a converted Hugging Face directory (bf16 safetensors, tokenizer, configs)
    hf/gguf-<sha256[:16]>/    the same for a user's GGUF file
    hf/*/spekula.json         inside each converted directory: the sha256 of the GGUF it was made from

A file's record is trusted while the file's size and mtime still match it, so a verified
gigabyte is hashed once, not on every start. Directories are built under a temporary name and
renamed into place with their record already inside, so a half-built one is never mistaken for
a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

HF_MARKER = "spekula.json"
_BLOCK = 8 << 20  # 8 MiB reads: large enough that hashing runs at the digest's speed


def cache_dir() -> Path:
    """Read on every call, so a test or a user can point it elsewhere with SPEKULA_CACHE."""
    env = os.environ.get("SPEKULA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spekula"


def gguf_dir() -> Path:
    return cache_dir() / "gguf"


def hf_root() -> Path:
    return cache_dir() / "hf"


def temp_sibling(path: Path) -> Path:
    """A name in the same directory (so the final rename is atomic), unique to this process."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def read_json(path: Path) -> dict | None:
    """None for a missing or unreadable record: either way the thing it describes is rebuilt."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def recorded_sha256(path: Path, record: Path) -> str | None:
    """The sha256 in `record` if `path` still has the size and mtime recorded with it, else None."""
    data = read_json(record)
    try:
        st = path.stat()
    except OSError:
        return None
    if data is None or data.get("size") != st.st_size or data.get("mtime_ns") != st.st_mtime_ns:
        return None
    sha = data.get("sha256")
    return sha if isinstance(sha, str) else None


def record_sha256(path: Path, record: Path, sha256: str, **extra: object) -> None:
    st = path.stat()
    write_json(record, {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns, **extra})


def file_sha256(path: Path, record: Path) -> str:
    """The file's sha256: from its record when still valid, otherwise hashed once and recorded."""
    sha = recorded_sha256(path, record)
    if sha is None:
        sha = hash_file(path)
        record_sha256(path, record, sha)
    return sha


def hf_ready(directory: Path, source_sha256: str) -> bool:
    """A converted directory counts only if its marker names the GGUF we would build it from."""
    marker = read_json(directory / HF_MARKER)
    return marker is not None and marker.get("source_sha256") == source_sha256 and (directory / "config.json").is_file()


def build_dir(final: Path, marker: dict, build: Callable[[Path], None]) -> None:
    """Run build(tmp) into a fresh temporary directory, write the marker, then rename it to `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        write_json(tmp / HF_MARKER, marker)
        if final.exists():  # a stale build from another GGUF, or one another process just finished
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
