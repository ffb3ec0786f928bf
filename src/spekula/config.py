"""Frozen configuration values, validated where they are made.

Every check raises ConfigError with a message that names the option and says what to change, so the
CLI, the server and library callers all report bad input the same way. The speculation knobs a user sets
(SpecConfig's, SuffixOptions') are declared once each (spekula.knobs): their flag, default, bounds and help,
from which their command-line flags, their checks and bench's and tune's keys are derived.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spekula.errors import ConfigError
from spekula.knobs import check_knobs, is_int, is_number, knob

# --k auto's longest draft. Where a wide verify pass is cheap (oneDNN-packed fp32 weights) and a draft
# is free (n-gram lookup), code edits copy runs long enough to fill it; where a wide pass is dear, the
# cost model never picks that far anyway (docs/BENCHMARKS.md, "Pass costs by width" and "Packed fp32";
# `scripts/pass_costs.py --widths`, `scripts/experiments/ngram_replay.py --k-max`).
K_MAX = 16
K_LIMIT = 64  # the longest draft any k or k_max may ask for
MIB = 1 << 20  # bytes in a MiB (--suffix-cache-mb)


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

    cache_entries: int = knob(
        256,
        "--suffix-cache-entries",
        "earlier requests whose outputs later requests may draft from (default {default}; 0: none). A server "
        "keeps them per API key",
        low=0,
        metavar="N",
    )
    # In MiB, as a user writes it; the cache counts bytes (cache_bytes: an upper bound, counted per token).
    cache_mb: float = knob(
        64.0,
        "--suffix-cache-mb",
        "memory those outputs may hold, in MiB (default {default}); least recently used out first",
        low=0,
        metavar="MB",
        noun="a number of MiB",
    )
    max_depth: int = knob(
        32,
        "--suffix-max-depth",
        "longest suffix of the context matched, in tokens (default {default})",
        low=1,
        metavar="N",
    )
    min_token_prob: float = knob(
        0.1,
        "--suffix-min-token-prob",
        "stop a draft when its continuation's frequency among the matches (multiplied along the draft) falls "
        "below P (default {default}); a draft's first token needs every match examined to agree on it",
        low=0,
        high=1,
        metavar="P",
        noun="a probability",
    )
    spec_factor: float = knob(
        1.0,
        "--suffix-spec-factor",
        "a draft is at most F x the matched length (default {default})",
        low=0,
        low_open=True,
        metavar="F",
    )

    def __post_init__(self) -> None:
        check_knobs(self)

    @property
    def cache_bytes(self) -> int:
        """--suffix-cache-mb in bytes, what the cache counts."""
        return int(self.cache_mb * MIB)


@dataclass(frozen=True)
class SpecConfig:
    """What to speculate with.

    k: tokens drafted per step; 0 = plain decoding through the same loop; None = chosen by the
    controller (spekula.control) from measured costs and the running acceptance rate.
    """

    # Not a knob: its flag --k takes 'auto' (None) as well as a number; options.add_model_options declares it,
    # __post_init__ checks it. Auto for a library caller as for the CLI and the server: a fixed k drafts whatever
    # the text, and where drafts are rejected (chat, creative writing) that is slower than plain decoding
    # (scripts/experiments/chat_overhead.py).
    k: int | None = None
    k_max: int = knob(K_MAX, "--k-max", "--k auto's longest draft (default {default})", low=1, high=K_LIMIT)
    ngram_max: int = knob(4, "--ngram-max", "n-gram lookup: longest suffix matched (default {default})", low=1)
    ngram_min: int = knob(1, "--ngram-min", "n-gram lookup: shortest suffix matched (default {default})", low=1)
    # A draft model stops its draft at the first token it gives less than this probability (that
    # token is still verified); None = always draft k. transformers' assistant_confidence_threshold.
    draft_confidence: float | None = knob(
        None,
        "--draft-confidence",
        "a draft model stops its draft at the first token it gives probability < P (like transformers' "
        "assistant_confidence_threshold; default: off, the controller's k only)",
        kind=float,
        low=0,
        low_open=True,
        high=1,
        high_open=True,
        metavar="P",
        noun="a probability",
    )
    suffix: SuffixOptions = SuffixOptions()  # the suffix proposer's (used by --draft suffix only)
    # Keep the last finished request's cache for the next request that starts with the same tokens (a
    # chat's next turn): it prefills only the rest (spekula.prompt_cache). Not speculation, but the engine's.
    prompt_cache: bool = knob(
        True,
        "--prompt-cache",
        "keep the last finished request's cache, so a request that starts with the same tokens (a chat's next "
        "turn, a shared system prompt) prefills only the rest, like llama.cpp's cache_prompt (default: on)",
    )
    # Where a row's bits depend on the kind of pass that computed it (llama.cpp's exact mode), the prompt cache takes
    # only rows a fresh prefill of the new prompt would compute alike (spekula.prompt_cache); on: any row it shares.
    prompt_cache_any_rows: bool = knob(
        False,
        "--prompt-cache-any-rows",
        "with the prompt cache on llama.cpp in exact mode, reuse every kept row a prompt shares, as llama.cpp's "
        "cache_prompt does: a re-sent prompt, or a short one after a long one with the same start, prefills "
        "less, but a greedy answer may then depend on the requests served before it (default: off, only rows a "
        "fresh prefill of the prompt would compute bit for bit alike; a conversation's next turn takes its last "
        "answer either way)",
    )
    # At a plain step of a request that has verified nothing yet, score the draft a free proposer (suffix,
    # n-gram) would have made against the tokens emitted next, so the controller learns from it
    # (spekula.shadow). Off by default: in same-run A/Bs it lowered the median prompt's speedup while
    # raising copy-heavy ones (docs/decisions/0005-shadow-drafts-off.md). Not a knob: no command has a flag
    # for it (bench's --spec shadow=on sets it per configuration).
    shadow_drafts: bool = False

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.ngram_max < self.ngram_min:
            raise ConfigError(
                f"--ngram-max must be an integer >= --ngram-min ({self.ngram_min}), got {self.ngram_max!r}"
            )
        if not isinstance(self.shadow_drafts, bool):
            raise ConfigError(f"shadow_drafts must be true or false, got {self.shadow_drafts!r}")
        if self.k is not None and (not is_int(self.k) or self.k < 0):
            raise ConfigError(f"k (draft length) must be an integer >= 0 (0 = plain decoding), got {self.k!r}")
        if self.k is not None and self.k > K_LIMIT:
            raise ConfigError(f"k (draft length) must be at most {K_LIMIT}, got {self.k}; typical values are 2 to 8")
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
    # == plain decoding; its cost: docs/BENCHMARKS.md, `--exact`). On by default; off lets a server batch
    # requests in one shared context, where near-ties can flip. The other runtimes ignore it.
    exact: bool = True
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
