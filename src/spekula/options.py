"""Options every command that runs models shares (generate, serve, bench, tune, audit), and --config files.

The CLIs import from here and the top CLI (spekula.cli) imports the sub-commands: nothing imports a CLI
module back.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from spekula.config import BackendConfig, SamplingParams, SpecConfig, SuffixOptions
from spekula.errors import ConfigError
from spekula.knobs import add_knob_flags, knob_of, knob_values

SUFFIX_DEST = "suffix_"  # SuffixOptions' flags' dests: suffix_<field>, the names --config files use


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
    # --k-max, --ngram-max, --ngram-min, --draft-confidence, --prompt-cache: from SpecConfig's declarations
    add_knob_flags(p, SpecConfig)
    _add_runtime_options(p)
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="JSON file of option values (e.g. written by `spekula tune`); flags given on the command line win",
    )


def _add_runtime_options(p: argparse.ArgumentParser) -> None:
    """How the target and the draft run: precision, threads, context, --exact, the runtimes."""
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
        default=BackendConfig().exact,
        help="llama.cpp: score a block of tokens bit for bit as one token at a time, so greedy speculative output "
        "equals plain decoding in this mode: flash attention (llama.cpp's -fa on; with -ctk q8_0 on a build without "
        "the project's patches), blocks of up to 17 tokens a pass on the project's build, prompts in passes of 64 "
        "tokens or more, and a server batches requests in passes that narrow, "
        "each request in a KV stream of its own; its cost: docs/BENCHMARKS.md, --exact. --no-exact: llama.cpp's "
        "default kernels and one cell pool, where near-ties in the target's top two logits can flip (default: on; "
        "the other runtimes ignore it)",
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


def add_suffix_options(p: argparse.ArgumentParser) -> None:
    """The suffix proposer's knobs (--draft suffix; SuffixOptions' declarations), each flag's default None (not
    given: the proposer's default, which its help states). For generate and serve (bench and tune measure
    suffix with its defaults)."""
    g = p.add_argument_group("suffix proposer (--draft suffix)")
    add_knob_flags(g, SuffixOptions, prefix=SUFFIX_DEST, given_only=True)


def suffix_given(args: argparse.Namespace) -> dict[str, Any]:
    """The SuffixOptions values whose --suffix-* flags were given, by field name."""
    return knob_values(SuffixOptions, args, prefix=SUFFIX_DEST, given_only=True)


def suffix_from_args(args: argparse.Namespace) -> SuffixOptions:
    """--suffix-* as SuffixOptions (flags not given: the defaults)."""
    return SuffixOptions(**suffix_given(args))


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="makes sampled runs repeat exactly")


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    from spekula.proposers import SUFFIX

    given = [knob_of(SuffixOptions, name).flag for name in suffix_given(args)]
    if given and args.draft != SUFFIX:
        raise ConfigError(
            f"{', '.join(given)}: options of --draft {SUFFIX}, but --draft is {args.draft!r}; drop them or choose "
            f"--draft {SUFFIX}"
        )
    return SpecConfig(k=args.k, **knob_values(SpecConfig, args), suffix=suffix_from_args(args))


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


OPTION_TABLES = {"SpecConfig": SpecConfig, "SuffixOptions": SuffixOptions}  # docs/OPTIONS.md's tables


if __name__ == "__main__":  # docs/OPTIONS.md's tables of these options, from their declarations
    import sys
    from pathlib import Path

    from spekula.knobs import write_tables

    docs = sys.argv[1] if len(sys.argv) > 1 else "docs/OPTIONS.md"
    changed = write_tables(Path(docs), OPTION_TABLES)
    print(f"{docs}: {'tables rewritten' if changed else 'tables already current'}")
