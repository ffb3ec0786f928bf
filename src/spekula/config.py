"""Frozen configuration values, validated where they are made.

Every check raises ConfigError with a message that names the option and says what to change, so the
CLI, the server and library callers all report bad input the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeGuard

from spekula.errors import ConfigError

# --k auto's longest draft. Where a wide verify pass is cheap (oneDNN-packed fp32 weights) and a draft
# is free (n-gram lookup), code edits copy runs long enough to fill it; where a wide pass is dear, the
# cost model never picks that far anyway (docs/BENCHMARKS.md, "Pass costs by width" and "Packed fp32";
# `scripts/pass_costs.py --widths`, `scripts/experiments/ngram_replay.py --k-max`).
K_MAX = 16


def is_int(value: object) -> TypeGuard[int]:
    """An integer, and not a bool (to Python True is the integer 1; to a user it is never a count).
    The one such check: every option, request field and file field that takes an integer uses it."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """A finite int or float, and not a bool (NaN passes no range check, so it must fail this one)."""
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))  # an int of any size is finite


@dataclass(frozen=True)
class SamplingParams:
    """How the target's (and the draft's) logits become a distribution.

    temperature 0 means greedy decoding. The filters apply in this order, each to the renormalised
    result of the previous one: temperature, top-k, top-p, min-p (the order vLLM uses).
    One function, spekula.sampling.probabilities, applies them to draft and target alike.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1.0 = no nucleus filter
    min_p: float = 0.0  # 0.0 = no min-p filter
    seed: int | None = None

    def __post_init__(self) -> None:
        if not is_number(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not is_int(self.top_k) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not is_number(self.min_p) or not 0.0 <= self.min_p < 1.0:
            raise ConfigError(f"min_p must be in [0, 1) (0 = off), got {self.min_p!r}")
        if self.seed is not None and not is_int(self.seed):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SuffixOptions:
    """The suffix proposer's knobs a user may set (spekula.proposers.suffix.SuffixConfig holds these and
    the rest). Its cross-request cache holds earlier requests' outputs for as long as the engine or
    server runs, bounded by entries and by bytes (least recently used out first)."""

    cache_entries: int = 256  # earlier requests kept for drafting (0: no cross-request cache)
    cache_bytes: int = 64 << 20  # ... and the memory they may hold (an upper bound, counted per token)
    max_depth: int = 32  # longest suffix of the context matched, in tokens
    min_token_prob: float = 0.1  # stop drafting when the continuation's empirical probability falls below
    spec_factor: float = 1.0  # a draft is at most spec_factor x the matched length

    def __post_init__(self) -> None:
        if not is_int(self.max_depth) or self.max_depth < 1:
            raise ConfigError(f"suffix max_depth must be an integer >= 1, got {self.max_depth!r}")
        for name in ("cache_entries", "cache_bytes"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ConfigError(f"suffix {name} must be an integer >= 0 (0: no cross-request cache), got {value!r}")
        if not is_number(self.spec_factor) or not self.spec_factor > 0:
            raise ConfigError(
                f"suffix spec_factor must be > 0 (a draft is at most spec_factor x the matched length), "
                f"got {self.spec_factor!r}"
            )
        if not is_number(self.min_token_prob) or not 0.0 <= self.min_token_prob <= 1.0:
            raise ConfigError(f"suffix min_token_prob must be a probability in [0, 1], got {self.min_token_prob!r}")


@dataclass(frozen=True)
class SpecConfig:
    """What to speculate with.

    k: tokens drafted per step; 0 = plain decoding through the same loop; None = chosen by the
    controller (spekula.control) from measured costs and the running acceptance rate.
    """

    k: int | None = 4
    k_max: int = K_MAX  # upper bound for the controller when k is None
    ngram_max: int = 4  # n-gram prompt lookup: longest suffix to match
    ngram_min: int = 1  # ... and the shortest
    # A draft model stops its draft at the first token it gives less than this probability (that
    # token is still verified); None = always draft k. transformers' assistant_confidence_threshold.
    draft_confidence: float | None = None
    suffix: SuffixOptions = SuffixOptions()  # the suffix proposer's (used by --draft suffix only)
    # Keep the last finished request's cache for the next request that starts with the same tokens (a
    # chat's next turn): it prefills only the rest (spekula.prompt_cache). Not speculation, but the engine's.
    prompt_cache: bool = True
    # At a plain step of a request that has verified nothing yet, score the draft a free proposer (suffix,
    # n-gram) would have made against the tokens emitted next, so the controller learns from it
    # (spekula.shadow). Off by default: in same-run A/Bs it lowered the median prompt's speedup while
    # raising copy-heavy ones (docs/decisions/0005-shadow-drafts-off.md).
    shadow_drafts: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_cache, bool):
            raise ConfigError(f"prompt_cache must be true or false, got {self.prompt_cache!r}")
        if not isinstance(self.shadow_drafts, bool):
            raise ConfigError(f"shadow_drafts must be true or false, got {self.shadow_drafts!r}")
        if self.k is not None and (not is_int(self.k) or self.k < 0):
            raise ConfigError(f"k (draft length) must be an integer >= 0 (0 = plain decoding), got {self.k!r}")
        if self.k is not None and self.k > 64:
            raise ConfigError(f"k (draft length) must be at most 64, got {self.k}; typical values are 2 to 8")
        if not is_int(self.k_max) or not 1 <= self.k_max <= 64:
            raise ConfigError(f"k_max must be an integer in [1, 64], got {self.k_max!r}")
        if not is_int(self.ngram_min) or self.ngram_min < 1:
            raise ConfigError(f"ngram_min must be an integer >= 1, got {self.ngram_min!r}")
        if not is_int(self.ngram_max) or self.ngram_max < self.ngram_min:
            raise ConfigError(f"ngram_max must be an integer >= ngram_min ({self.ngram_min}), got {self.ngram_max!r}")
        c = self.draft_confidence
        if c is not None and (not is_number(c) or not 0.0 < c < 1.0):
            raise ConfigError(f"draft_confidence must be a probability strictly between 0 and 1 (e.g. 0.4), got {c!r}")
        if not isinstance(self.suffix, SuffixOptions):
            raise ConfigError(f"suffix must be a SuffixOptions, got {self.suffix!r}")


@dataclass(frozen=True)
class StopConfig:
    """When a request ends. Stop strings are matched on text, outside the engine (spekula.text)."""

    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ConfigError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop_token_ids", frozenset(self.stop_token_ids))


DTYPES = ("float32", "bfloat16", "float16")
MAX_PARALLEL = 256  # llama.cpp's most sequence ids in one context


@dataclass(frozen=True)
class BackendConfig:
    """How one model runs."""

    dtype: str = "float32"
    threads: int | None = None  # None = leave torch's default
    runtime: str = "transformers"  # a name in spekula.backends.BACKENDS: transformers | native | llamacpp
    # llama.cpp: compute a block of tokens bit for bit as one token at a time (greedy speculative output
    # == plain decoding), at the cost in docs/BENCHMARKS.md (`--exact`). The other runtimes are block-invariant.
    exact: bool = False
    # Most tokens one sequence (prompt + output) holds; None: the runtime's default (llama.cpp 4096, its
    # KV cache allocated whole per running request; the others the model's own context).
    context_length: int | None = None
    # Sequences one pass may carry together (llama.cpp: sequence ids in one shared context, its KV cache
    # for parallel x context_length tokens allocated at load). The server asks for one per running
    # request; 1: every sequence alone. The native runner batches any number; transformers none.
    parallel: int = 1

    def __post_init__(self) -> None:
        if not is_int(self.parallel) or not 1 <= self.parallel <= MAX_PARALLEL:
            raise ConfigError(
                f"parallel must be an integer in [1, {MAX_PARALLEL}] (sequences in one pass), got {self.parallel!r}"
            )
        if not isinstance(self.exact, bool):
            raise ConfigError(f"exact must be true or false, got {self.exact!r}")
        if self.context_length is not None and (not is_int(self.context_length) or self.context_length < 2):
            raise ConfigError(f"context_length must be an integer >= 2, got {self.context_length!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and (not is_int(self.threads) or self.threads < 1):
            raise ConfigError(f"threads must be an integer >= 1, got {self.threads!r}")
