"""HOW a model runs. One protocol (backends.base), one module per runtime, and this registry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spekula.backends.base import Backend, Capabilities, Sequence
from spekula.config import BackendConfig
from spekula.errors import ConfigError


def _transformers(path: Path, name: str, config: BackendConfig) -> Backend:
    from spekula.backends.hf import TransformersBackend

    return TransformersBackend.load(path, name=name, config=config)


BACKENDS: dict[str, Callable[[Path, str, BackendConfig], Backend]] = {
    "transformers": _transformers,
}


def load_backend(kind: str, path: Path, name: str, config: BackendConfig = BackendConfig()) -> Backend:
    if kind not in BACKENDS:
        raise ConfigError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[kind](Path(path), name, config)


__all__ = ["Backend", "Capabilities", "Sequence", "BACKENDS", "load_backend"]
