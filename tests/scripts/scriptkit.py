"""Test kit for scripts/: a script loaded as a module, for as long as a test needs it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@contextmanager
def loaded(relative: str) -> Iterator[ModuleType]:
    """scripts/<relative> as a module named after the file; registered in sys.modules while it is
    loaded (dataclasses look their module up while being defined), and removed afterwards."""
    path = SCRIPTS / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
