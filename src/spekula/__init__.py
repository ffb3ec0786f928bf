"""spekula: lossless speculative decoding, measured against plain decoding."""

from spekula.config import SamplingParams, SpecConfig
from spekula.errors import ConfigError, ModelError, SpekulaError

__version__ = "0.1.0"

__all__ = ["SamplingParams", "SpecConfig", "ConfigError", "ModelError", "SpekulaError", "__version__"]
