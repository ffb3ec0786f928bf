"""`spekula` command line: generate | models | bench | tune | audit | serve | doctor.

This module builds the parser from the sub-commands' `register` functions and runs `generate`; the
options the commands share live in spekula.options, so no sub-command imports this module.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any

from spekula import doctor
from spekula.bench import cli as bench_cli
from spekula.config import SamplingParams, StopConfig
from spekula.errors import SpekulaError
from spekula.hugepages import reexec_with_huge_pages
from spekula.models import cli as models_cli
from spekula.options import (
    add_model_options,
    add_sampling_options,
    add_suffix_options,
    backend_from_args,
    draft_backend_from_args,
    load_config_file,
    resolve_draft,
    sampling_from_args,
    spec_from_args,
)
from spekula.server import cli as server_cli

# An edit whose answer re-emits most of the prompt, as coding assistants' answers do: where drafting
# from the context (--draft suffix or ngram) pays even on a CPU (`make demo`)
DEFAULT_PROMPT = """Add type hints to this function and fix its bug: it drops the last window. Reply with the whole \
corrected function only.

```python
def moving_average(values, window):
    \"\"\"Return the averages of every `window` consecutive values.\"\"\"
    if window <= 0:
        raise ValueError("window must be positive")
    if len(values) < window:
        return []
    averages = []
    total = sum(values[:window])
    for i in range(window, len(values)):
        averages.append(total / window)
        total += values[i] - values[i - window]
    return averages
```
"""


def register_generate(sub: Any) -> dict[str, argparse.ArgumentParser]:
    p = sub.add_parser("generate", help="generate text with speculative decoding")
    p.add_argument(
        "prompt", nargs="?", default=None, help="prompt text ('-' reads stdin; default: a built-in code edit)"
    )
    add_model_options(p)
    add_suffix_options(p)
    add_sampling_options(p)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also run plain decoding of the target; report speedup, identity and, where greedy outputs part, the "
        "first difference with the target's top-2 logit gap there in both runs (near-tie or divergence)",
    )
    p.add_argument("--trace", metavar="FILE", default=None, help="write one JSON line per step to FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    p.set_defaults(func=cmd_generate)
    return {"generate": p}


def cmd_generate(args: argparse.Namespace) -> int:
    from spekula.divergence import TopLog, guarantee
    from spekula.pipeline import Pipeline
    from spekula.trace import JsonlTrace

    sampling = sampling_from_args(args)
    stop = StopConfig(max_tokens=args.max_tokens, stop=tuple(args.stop))
    spec = spec_from_args(args)
    backend = backend_from_args(args)
    prompt = sys.stdin.read() if args.prompt == "-" else (args.prompt or DEFAULT_PROMPT)
    chat = args.chat or args.prompt is None  # the built-in prompt is an instruction
    _log(f"loading target {args.target} ({backend.runtime}) and draft {args.draft} ...")
    pipe = Pipeline.load(args.target, args.draft, spec, backend, draft_backend_from_args(args))
    prompt_ids = pipe.codec.encode(prompt, chat=chat)
    promise = guarantee(pipe.target)
    if args.compare:
        pipe.warmup()

    with ExitStack() as stack:
        recorder = JsonlTrace(stack.enter_context(open(args.trace, "w"))) if args.trace else None
        spec_log = TopLog(recorder) if args.compare else None  # the target's top 2 per position, for a divergence
        run = pipe.start(prompt_ids, sampling, stop, recorder=spec_log if spec_log is not None else recorder)
        for delta in run:
            if not args.json:
                sys.stdout.write(delta)
                sys.stdout.flush()
        result = run.result()
    out: dict[str, Any] = result.to_dict()
    out["config"] = {
        "target": args.target,
        "draft": args.draft,
        "k": "auto" if args.k is None else args.k,
        "backend": backend.runtime,
        "dtype": args.dtype,
        **_sampling_dict(sampling),
    }
    if pipe.engine.proposer is not None:
        out["guarantee"] = promise.to_dict()
    if args.compare:
        assert spec_log is not None  # --compare recorded it
        out.update(_compare(pipe, prompt_ids, sampling, stop, result, spec_log, promise))
    if args.json:
        print(json.dumps(out))
    else:
        print()
        print(_summary(out))
    return 0


def _compare(pipe, prompt_ids: list[int], sampling, stop: StopConfig, result, spec_log, promise) -> dict[str, Any]:
    """generate --compare: the same prompt decoded plainly; the speedup, whether the outputs are identical and,
    greedy, where they part and the near-ties where they could have."""
    from spekula.divergence import NEAR_TIE_GAP, NEAR_TIES, TopLog, find_divergence, near_ties

    out: dict[str, Any] = {}
    plain_log = TopLog()  # both runs record, so both pay the same for it
    base = pipe.generate(prompt_ids, sampling, stop, plain=True, recorder=plain_log)
    out["baseline"] = {
        "text": base.text,
        "token_ids": base.token_ids,
        "tokens_per_s": base.stats.tokens_per_s,
        "stats": base.stats.to_dict(),
    }
    out["identical"] = base.token_ids == result.token_ids
    out["speedup"] = _ratio(result.stats.tokens_per_s, base.stats.tokens_per_s)
    if sampling.greedy:  # sampled outputs may differ without anything wrong: no divergence to explain
        divergence = find_divergence(base.token_ids, result.token_ids, plain_log, spec_log, pipe.codec.decode)
        out["divergence"] = divergence.to_dict() if divergence is not None else None
        if promise.kind == NEAR_TIES:  # where this run could have parted from plain decoding, listed
            ties = near_ties(spec_log, len(result.token_ids))
            out["near_ties"] = {"gap": NEAR_TIE_GAP, "positions": [{"position": p, "top2_gap": g} for p, g in ties]}
    return out


def _summary(out: dict[str, Any]) -> str:
    s = out["stats"]
    lines = [
        "-" * 60,
        f"{len(out['token_ids'])} tokens, {_fmt(s['tokens_per_s'])} tok/s, TTFT {_fmt(s['ttft_s'])} s, "
        f"finish: {out['finish_reason']}",
        f"drafted {s['drafted']}, accepted {s['accepted']}, alpha {_fmt(s['alpha'])}, tau {_fmt(s['tau'])}, "
        f"target passes {s['target_passes']}",
        "acceptance by draft position: "
        + (" ".join(f"{a:.2f}" for a in s["acceptance_by_position"]) or "n/a (nothing drafted)"),
        "k chosen (k: steps): "
        + ", ".join(f"{k}: {n}" for k, n in s["k_chosen"].items())
        + (
            f"; controller's predicted speedup {_fmt(s['predicted_speedup'])}x"
            if s.get("predicted_speedup") is not None
            else ""
        ),
    ]
    if "baseline" in out:
        lines.append(
            f"plain decoding ({out['config']['backend']}): {_fmt(out['baseline']['tokens_per_s'])} tok/s -> "
            f"speedup {_fmt(out['speedup'])}x, "
            f"outputs {'identical' if out['identical'] else 'DIFFERENT'}"
        )
    if "guarantee" in out:
        lines.append(f"guarantee: greedy output is {out['guarantee']['text']}")
    if "near_ties" in out:
        ties = out["near_ties"]["positions"]
        where = ", ".join(f"{t['position']} (gap {t['top2_gap']:.3g})" for t in ties[:10]) + (
            " ..." if len(ties) > 10 else ""
        )
        lines.append(f"near-ties in this run (top-2 logit gap < {out['near_ties']['gap']}): " + (where or "none"))
    if out.get("divergence"):
        lines.append(out["divergence"]["description"])
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
    return parser_and_commands()[0]


def parser_and_commands() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each command's own parser by name (where --config sets that command's defaults)."""
    parser = argparse.ArgumentParser(
        prog="spekula", description="Lossless speculative decoding, measured against plain decoding."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, argparse.ArgumentParser] = {}
    for register in (register_generate, models_cli.register, bench_cli.register, server_cli.register, doctor.register):
        commands.update(register(sub))
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    """The `spekula` program; argv None: this process's command line (and a restart onto huge pages first:
    spekula.hugepages), a list: those arguments, in this process as it is (tests, embedding)."""
    if argv is None:
        reexec_with_huge_pages()
    parser, commands = parser_and_commands()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "config", None):
            allowed = set(vars(args)) - {"func", "command", "config"}
            commands[args.command].set_defaults(**load_config_file(args.config, allowed))
            args = parser.parse_args(argv)  # flags on the command line still win over the file
        resolve_draft(args)
        return args.func(args)
    except SpekulaError as e:
        print(f"spekula: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
