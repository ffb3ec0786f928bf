"""spekula: lossless speculative decoding, measured against plain decoding.

The library's names: `from spekula import Pipeline, SamplingParams, SpecConfig, StopConfig` (README.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.errors import ConfigError, ModelError, SpekulaError

if TYPE_CHECKING:
    from spekula.pipeline import Pipeline

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ModelError",
    "Pipeline",
    "SamplingParams",
    "SpecConfig",
    "SpekulaError",
    "StopConfig",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Pipeline is imported on first use. Every `import spekula.x` runs this file first, and the
    # pipeline pulls in torch, the engine and every backend, which light modules (config, the CLIs'
    # option parsing) must not pay for.
    if name == "Pipeline":
        from spekula.pipeline import Pipeline

        return Pipeline
    raise AttributeError(f"module 'spekula' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Pipeline"})
