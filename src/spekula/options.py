"""Options every command that runs models shares (generate, serve, bench, tune, audit), and --config files.

The CLIs import from here and the top CLI (spekula.cli) imports the sub-commands: nothing imports a CLI
module back.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from spekula.config import K_MAX, BackendConfig, SamplingParams, SpecConfig, SuffixOptions, is_number
from spekula.errors import ConfigError

MIB = 1 << 20
SUFFIX_FLAGS = ("cache_entries", "cache_mb", "max_depth", "min_token_prob", "spec_factor")  # --suffix-<name>


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Target, draft, speculation and runtime options shared by every command that runs models."""
    from spekula.pipeline import DEFAULT, DEFAULT_DRAFT, DEFAULT_TARGET

    p.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"target model: catalogue name, HF directory or .gguf (default {DEFAULT_TARGET})",
    )
    p.add_argument(
        "--draft",
        default=DEFAULT,
        help="proposer: a draft model (name or path), 'ngram', 'suffix', or 'none' (default: 'suffix' on a "
        f"llama.cpp target, the draft model {DEFAULT_DRAFT} on the other runtimes)",
    )
    p.add_argument(
        "--k",
        type=k_option,
        default=None,
        help="tokens drafted per step: a number (0 = plain decoding) or 'auto' (default: the cost model chooses)",
    )
    p.add_argument("--k-max", type=int, default=K_MAX, help=f"--k auto's longest draft (default {K_MAX})")
    p.add_argument("--ngram-max", type=int, default=4, help="n-gram lookup: longest suffix matched (default 4)")
    p.add_argument("--ngram-min", type=int, default=1, help="n-gram lookup: shortest suffix matched (default 1)")
    p.add_argument(
        "--draft-confidence",
        type=float,
        default=None,
        metavar="P",
        help="a draft model stops its draft at the first token it gives probability < P (like transformers' "
        "assistant_confidence_threshold; default: off, the controller's k only)",
    )
    p.add_argument("--dtype", default="float32", help="float32 (exact comparisons) | bfloat16 (faster) | float16")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: the runtime's choice)")
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="most tokens a request (prompt + output) may hold (default: llama.cpp 4096, which allocates this KV "
        "cache for each running request; the other runtimes the model's own context)",
    )
    p.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="llama.cpp: score a block of tokens bit for bit as one token at a time, so greedy speculative output "
        "equals plain decoding in this mode (without it, near-ties in the target's top two logits can flip): flash "
        "attention, a Q8_0 K cache (llama.cpp's -fa on -ctk q8_0), blocks of at most 3 tokens a pass. Plain "
        "decoding costs what it does without it; speculation gains less (k=auto drafts 2 tokens a step), and a "
        "server gives each request its own context (no batching); its cost: docs/BENCHMARKS.md, --exact "
        "(default: off; the other runtimes need no such flag)",
    )
    p.add_argument(
        "--prompt-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the last finished request's cache, so a request that starts with the same tokens (a chat's next "
        "turn, a shared system prompt) prefills only the rest, like llama.cpp's cache_prompt (default: on)",
    )
    p.add_argument(
        "--backend",
        default=None,
        help="how the target runs: native | transformers | llamacpp (default: llamacpp for a GGUF target, such as "
        "a built-in one, on a CPU when llama-cpp-python is installed, else native)",
    )
    p.add_argument(
        "--draft-backend",
        default=None,
        help="how the draft model runs (default: llamacpp for a built-in draft when the target runs in PyTorch, "
        "else like --backend)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="JSON file of option values (e.g. written by `spekula tune`); flags given on the command line win",
    )


def add_suffix_options(p: argparse.ArgumentParser) -> None:
    """The suffix proposer's knobs (--draft suffix; SuffixOptions); None: the proposer's default. For
    generate and serve (bench and tune measure suffix with its defaults)."""
    d = SuffixOptions()
    g = p.add_argument_group("suffix proposer (--draft suffix)")
    g.add_argument(
        "--suffix-cache-entries",
        type=int,
        default=None,
        metavar="N",
        help=f"earlier requests whose outputs later requests may draft from (default {d.cache_entries}; "
        "0: none). A server keeps them per API key",
    )
    g.add_argument(
        "--suffix-cache-mb",
        type=float,
        default=None,
        metavar="MB",
        help=f"memory those outputs may hold, in MiB (default {d.cache_bytes / MIB:g}); least recently used out first",
    )
    g.add_argument(
        "--suffix-max-depth",
        type=int,
        default=None,
        metavar="N",
        help=f"longest suffix of the context matched, in tokens (default {d.max_depth})",
    )
    g.add_argument(
        "--suffix-min-token-prob",
        type=float,
        default=None,
        metavar="P",
        help="stop a draft when its continuation's frequency among the matches (multiplied along the draft) falls "
        f"below P (default {d.min_token_prob:g})",
    )
    g.add_argument(
        "--suffix-spec-factor",
        type=float,
        default=None,
        metavar="F",
        help=f"a draft is at most F x the matched length (default {d.spec_factor:g})",
    )


def suffix_from_args(args: argparse.Namespace) -> SuffixOptions:
    """--suffix-* as SuffixOptions (flags not given: the defaults)."""
    given: dict[str, Any] = {}
    for name in SUFFIX_FLAGS:
        value = getattr(args, f"suffix_{name}", None)
        if value is not None and name != "cache_mb":
            given[name] = value
    mb = getattr(args, "suffix_cache_mb", None)
    if mb is not None:
        if not is_number(mb) or mb < 0:
            raise ConfigError(f"--suffix-cache-mb must be a number of MiB >= 0 (0: no cross-request cache), got {mb!r}")
        given["cache_bytes"] = int(mb * MIB)
    return SuffixOptions(**given)


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="makes sampled runs repeat exactly")


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    from spekula.proposers import SUFFIX

    given = [f"--suffix-{n.replace('_', '-')}" for n in SUFFIX_FLAGS if getattr(args, f"suffix_{n}", None) is not None]
    if given and args.draft != SUFFIX:
        raise ConfigError(
            f"{', '.join(given)}: options of --draft {SUFFIX}, but --draft is {args.draft!r}; drop them or choose "
            f"--draft {SUFFIX}"
        )
    return SpecConfig(
        k=args.k,
        k_max=args.k_max,
        ngram_max=args.ngram_max,
        ngram_min=args.ngram_min,
        draft_confidence=args.draft_confidence,
        suffix=suffix_from_args(args),
        prompt_cache=getattr(args, "prompt_cache", True),
    )


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
    )


def backend_from_args(args: argparse.Namespace) -> BackendConfig:
    from spekula.pipeline import default_runtime

    return BackendConfig(
        dtype=args.dtype,
        threads=args.threads,
        runtime=args.backend or default_runtime(args.target, dtype=args.dtype),
        exact=args.exact,
        context_length=args.context_length,
    )


def resolve_draft(args: argparse.Namespace) -> None:
    """--draft left at its default: the proposer pipeline.default_draft picks for the target's runtime, so every
    command (and a tuned config or a bench --spec without draft=) sees a concrete proposer."""
    from spekula.pipeline import DEFAULT, default_draft

    if getattr(args, "draft", None) == DEFAULT:
        args.draft = default_draft(backend_from_args(args).runtime)


def draft_backend_from_args(args: argparse.Namespace, draft: str | None = None) -> BackendConfig:
    """How the draft model (default: --draft) runs."""
    from spekula.pipeline import DEFAULT, default_draft, draft_backend_config

    target = backend_from_args(args)
    draft = draft or args.draft
    return draft_backend_config(
        default_draft(target.runtime) if draft == DEFAULT else draft, target, args.draft_backend
    )


def parse_k(text: str) -> int | None:
    """k as a user writes it: an integer (0 = plain decoding) or 'auto' (None: the controller chooses)."""
    if text.strip() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"k must be an integer >= 0 or 'auto', got {text!r}") from None


def k_option(text: str) -> int | None:
    """parse_k for argparse, which reports an ArgumentTypeError as a usage error."""
    try:
        return parse_k(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def read_json_object(path: str, flag: str, not_an_object: str) -> dict[str, Any]:
    """The JSON object in the file an option (`flag`) names; a ConfigError when it cannot be read, is
    not JSON, or holds something else than an object (the error says `not_an_object`)."""
    try:
        with open(path) as f:
            value = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read {flag} {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} {path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(not_an_object)
    return value


def load_config_file(path: str, allowed: set[str]) -> dict[str, Any]:
    """Option values from a JSON object whose keys are option names (underscores, e.g. top_p)."""
    values = read_json_object(path, "--config", f"--config {path} must hold a JSON object of option names to values")
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    if isinstance(values.get("k"), str):
        values["k"] = parse_k(values["k"])
    return values
