"""Options every command that runs models shares (generate, serve, bench, tune, audit), and --config files.

The CLIs import from here and the top CLI (spekula.cli) imports the sub-commands: nothing imports a CLI
module back.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from spekula.config import K_MAX, BackendConfig, SamplingParams, SpecConfig
from spekula.errors import ConfigError


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Target, draft, speculation and runtime options shared by every command that runs models."""
    from spekula.pipeline import DEFAULT_DRAFT, DEFAULT_RUNTIME, DEFAULT_TARGET

    p.add_argument(
        "--target", default=DEFAULT_TARGET,
        help=f"target model: catalogue name, HF directory or .gguf (default {DEFAULT_TARGET})",
    )
    p.add_argument(
        "--draft", default=DEFAULT_DRAFT,
        help=f"proposer: a draft model (name or path), 'ngram', 'suffix', or 'none' (default {DEFAULT_DRAFT})",
    )
    p.add_argument(
        "--k", type=k_option, default=None,
        help="tokens drafted per step: a number (0 = plain decoding) or 'auto' (default: the cost model chooses)",
    )
    p.add_argument("--k-max", type=int, default=K_MAX, help=f"--k auto's longest draft (default {K_MAX})")
    p.add_argument("--ngram-max", type=int, default=4, help="n-gram lookup: longest suffix matched (default 4)")
    p.add_argument("--ngram-min", type=int, default=1, help="n-gram lookup: shortest suffix matched (default 1)")
    p.add_argument(
        "--draft-confidence", type=float, default=None, metavar="P",
        help="a draft model stops its draft at the first token it gives probability < P (like transformers' "
             "assistant_confidence_threshold; default: off, the controller's k only)",
    )
    p.add_argument("--dtype", default="float32", help="float32 (exact comparisons) | bfloat16 (faster) | float16")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: the runtime's choice)")
    p.add_argument(
        "--backend", default=DEFAULT_RUNTIME,
        help=f"how the target runs: native | transformers | llamacpp (default {DEFAULT_RUNTIME})",
    )
    p.add_argument(
        "--draft-backend", default=None,
        help="how the draft model runs (default: llamacpp for a built-in draft when the target runs in PyTorch, "
             "else like --backend)",
    )
    p.add_argument(
        "--config", metavar="FILE", default=None,
        help="JSON file of option values (e.g. written by `spekula tune`); flags given on the command line win",
    )


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="makes sampled runs repeat exactly")


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    return SpecConfig(
        k=args.k, k_max=args.k_max, ngram_max=args.ngram_max, ngram_min=args.ngram_min,
        draft_confidence=args.draft_confidence,
    )


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
    )


def backend_from_args(args: argparse.Namespace) -> BackendConfig:
    return BackendConfig(dtype=args.dtype, threads=args.threads, runtime=args.backend)


def draft_backend_from_args(args: argparse.Namespace, draft: str | None = None) -> BackendConfig:
    """How the draft model (default: --draft) runs."""
    from spekula.pipeline import draft_backend_config

    return draft_backend_config(draft or args.draft, backend_from_args(args), args.draft_backend)


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


def load_config_file(path: str, allowed: set[str]) -> dict[str, Any]:
    """Option values from a JSON object whose keys are option names (underscores, e.g. top_p)."""
    try:
        with open(path) as f:
            values = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read --config {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--config {path} is not valid JSON: {e}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path} must hold a JSON object of option names to values")
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    if isinstance(values.get("k"), str):
        values["k"] = parse_k(values["k"])
    return values
