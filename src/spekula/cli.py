"""`spekula` command line: generate | models (bench, tune, audit and serve register here as they land)."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any

from spekula.config import K_MAX, BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.errors import ConfigError, SpekulaError

DEFAULT_PROMPT = (
    "Write a Python function `fibonacci(n)` that returns the n-th Fibonacci number iteratively, "
    "with a docstring and type hints, then a short test using assert."
)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Target, draft, speculation and runtime options shared by every command that runs models."""
    from spekula.pipeline import DEFAULT_DRAFT, DEFAULT_RUNTIME, DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model: catalogue name, HF directory or .gguf (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"proposer: a draft model (name or path), 'ngram', or 'none' (default {DEFAULT_DRAFT})")
    p.add_argument("--k", type=_k_value, default=None, help="tokens drafted per step: a number (0 = plain decoding) or 'auto' (default: the cost model chooses)")
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
    p.add_argument("--backend", default=DEFAULT_RUNTIME, help=f"how the target runs: native | transformers | llamacpp (default {DEFAULT_RUNTIME})")
    p.add_argument(
        "--draft-backend", default=None,
        help="how the draft model runs (default: llamacpp for a built-in draft when the target runs in PyTorch, else like --backend)",
    )
    p.add_argument("--config", metavar="FILE", default=None, help="JSON file of option values (e.g. written by `spekula tune`); flags given on the command line win")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="makes sampled runs repeat exactly")


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    return SpecConfig(k=args.k, k_max=args.k_max, ngram_max=args.ngram_max, ngram_min=args.ngram_min, draft_confidence=args.draft_confidence)


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed)


def backend_from_args(args: argparse.Namespace) -> BackendConfig:
    return BackendConfig(dtype=args.dtype, threads=args.threads, runtime=args.backend)


def draft_backend_from_args(args: argparse.Namespace, draft: str | None = None) -> BackendConfig:
    """How the draft model (default: --draft) runs."""
    from spekula.pipeline import draft_backend_config

    return draft_backend_config(draft or args.draft, backend_from_args(args), args.draft_backend)


def _k_value(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k must be an integer >= 0 or 'auto', got {text!r}") from None


def register_generate(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text with speculative decoding")
    p.add_argument("prompt", nargs="?", default=None, help="prompt text ('-' reads stdin; default: a built-in coding prompt)")
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--compare", action="store_true", help="also run plain decoding of the target; report speedup and identity")
    p.add_argument("--trace", metavar="FILE", default=None, help="write one JSON line per step to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from spekula.pipeline import Pipeline
    from spekula.trace import JsonlTrace

    sampling = sampling_from_args(args)
    stop = StopConfig(max_tokens=args.max_tokens, stop=tuple(args.stop))
    spec = spec_from_args(args)
    backend = backend_from_args(args)
    if sampling.seed is not None and not sampling.greedy and spec.k is None and args.draft != "none":
        _log("note: with --k auto the chosen k follows measured timings, so a seeded sampled run can differ between "
             "runs (its distribution does not); pass --k N for exact repeats")
    prompt = sys.stdin.read() if args.prompt == "-" else (args.prompt or DEFAULT_PROMPT)
    chat = args.chat or args.prompt is None  # the built-in prompt is an instruction
    _log(f"loading target {args.target} and draft {args.draft} ({args.dtype}) ...")
    pipe = Pipeline.load(args.target, args.draft, spec, backend, draft_backend_from_args(args))
    prompt_ids = pipe.codec.encode(prompt, chat=chat)
    if pipe.engine.proposer is not None and not pipe.target.capabilities.block_invariant:
        _log(f"note: the {args.backend} target computes a block of tokens with other kernels than one token, so greedy "
             "speculative output can differ from its plain decoding where its top two logits nearly tie "
             "(with --backend native in fp32 the kernels differ only in float rounding)")
    if args.compare:
        pipe.warmup()

    with ExitStack() as stack:
        recorder = JsonlTrace(stack.enter_context(open(args.trace, "w"))) if args.trace else None
        run = pipe.start(prompt_ids, sampling, stop, recorder=recorder)
        for delta in run:
            if not args.json:
                sys.stdout.write(delta)
                sys.stdout.flush()
        result = run.result()
    out: dict[str, Any] = result.to_dict()
    out["config"] = {"target": args.target, "draft": args.draft, "k": "auto" if args.k is None else args.k, "dtype": args.dtype, **_sampling_dict(sampling)}
    if args.compare:
        base = pipe.generate(prompt_ids, sampling, stop, plain=True)
        out["baseline"] = {"text": base.text, "token_ids": base.token_ids, "tokens_per_s": base.stats.tokens_per_s, "stats": base.stats.to_dict()}
        out["identical"] = base.token_ids == result.token_ids
        out["speedup"] = _ratio(result.stats.tokens_per_s, base.stats.tokens_per_s)
    if args.json:
        print(json.dumps(out))
    else:
        print()
        print(_summary(out))
    return 0


def _summary(out: dict[str, Any]) -> str:
    s = out["stats"]
    lines = [
        "-" * 60,
        f"{len(out['token_ids'])} tokens, {_fmt(s['tokens_per_s'])} tok/s, TTFT {_fmt(s['ttft_s'])} s, finish: {out['finish_reason']}",
        f"drafted {s['drafted']}, accepted {s['accepted']}, alpha {_fmt(s['alpha'])}, tau {_fmt(s['tau'])}, "
        f"target passes {s['target_passes']}",
        "acceptance by draft position: " + (" ".join(f"{a:.2f}" for a in s["acceptance_by_position"]) or "n/a (nothing drafted)"),
        "k chosen (k: steps): " + ", ".join(f"{k}: {n}" for k, n in s["k_chosen"].items())
        + (f"; controller's predicted speedup {_fmt(s['predicted_speedup'])}x" if s.get("predicted_speedup") is not None else ""),
    ]
    if "baseline" in out:
        lines.append(
            f"plain decoding: {_fmt(out['baseline']['tokens_per_s'])} tok/s -> speedup {_fmt(out['speedup'])}x, "
            f"outputs {'identical' if out['identical'] else 'DIFFERENT'}"
        )
    return "\n".join(lines)


def _sampling_dict(s: SamplingParams) -> dict[str, Any]:
    return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p, "seed": s.seed}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spekula", description="Lossless speculative decoding, measured against plain decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    register_generate(sub)
    from spekula.bench.cli import register as register_bench
    from spekula.models.cli import register as register_models
    from spekula.server.cli import register as register_serve

    register_models(sub)
    register_bench(sub)
    register_serve(sub)
    return parser


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
        raise ConfigError(f"--config {path}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    if isinstance(values.get("k"), str):
        values["k"] = _k_value(values["k"])
    return values


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "config", None):
            subparser = parser._subparsers._group_actions[0].choices[args.command]
            subparser.set_defaults(**load_config_file(args.config, set(vars(args)) - {"func", "command", "config"}))
            args = parser.parse_args(argv)  # flags on the command line still win over the file
        return args.func(args)
    except SpekulaError as e:
        print(f"spekula: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
