"""HOW a model runs. One protocol (backends.base), one module per runtime, and this registry:
the only place a runtime's name is a string."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spekula.backends.base import Backend, Capabilities, Sequence
from spekula.config import BackendConfig
from spekula.errors import ConfigError

TRANSFORMERS = "transformers"
NATIVE = "native"
LLAMACPP = "llamacpp"

# runtime name -> loader(hf_dir, name, config, gguf_path)
Loader = Callable[[Path, str, BackendConfig, "Path | None"], Backend]


def _transformers(path: Path, name: str, config: BackendConfig, gguf_path: Path | None) -> Backend:
    from spekula.backends.hf import TransformersBackend

    backend = TransformersBackend.load(path, name=name, config=config)
    if config.context_length is not None:  # a cap on the model's own context, as the native runner's max_cache_len
        backend.context_length = min(backend.context_length, config.context_length)
    return backend


def _native(path: Path, name: str, config: BackendConfig, gguf_path: Path | None) -> Backend:
    from spekula.backends.native import NativeBackend

    return NativeBackend.load(path, name=name, config=config, max_cache_len=config.context_length)


def _llamacpp(path: Path, name: str, config: BackendConfig, gguf_path: Path | None) -> Backend:
    from spekula.backends.llamacpp import LlamaCppBackend

    if gguf_path is None:
        raise ConfigError(
            f"the llamacpp backend runs GGUF files; {name!r} has none. Pass a catalogue name or a .gguf path"
        )
    if config.context_length is not None:
        return LlamaCppBackend(gguf_path, name=name, config=config, context_length=config.context_length)
    return LlamaCppBackend(gguf_path, name=name, config=config)


BACKENDS: dict[str, Loader] = {
    TRANSFORMERS: _transformers,
    NATIVE: _native,
    LLAMACPP: _llamacpp,
}


def load_backend(
    kind: str, path: Path, name: str, config: BackendConfig = BackendConfig(), gguf_path: Path | None = None
) -> Backend:
    if kind not in BACKENDS:
        raise ConfigError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[kind](Path(path), name, config, gguf_path)


__all__ = [
    "Backend",
    "Capabilities",
    "Sequence",
    "BACKENDS",
    "LLAMACPP",
    "NATIVE",
    "TRANSFORMERS",
    "load_backend",
]
