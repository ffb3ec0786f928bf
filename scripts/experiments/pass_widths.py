"""What a target pass costs by its width inside real requests: one built-in suite prompt decoded
plainly and with a proposer, each step traced, median seconds of the target pass by width (1 +
drafted tokens), and the request's total target time.

scripts/pass_costs.py times passes at one synthetic context; this times the passes a request
actually ran, at its own contexts, interleaved with the steps around them. An experiment, not a
maintained tool (scripts/experiments/README.md).

    .venv/bin/python scripts/experiments/pass_widths.py open-chat-01 [--draft ngram] [--max-tokens 48] [--repeats 2]
"""

import argparse
import statistics
from collections import defaultdict

from spekula.bench.workloads import builtin_workload
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.errors import ConfigError
from spekula.pipeline import load_model
from spekula.proposers import build_proposer
from spekula.trace import ListTrace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prompt_id", help="a built-in suite prompt, e.g. open-chat-01")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="ngram", help="a proposer without a model (e.g. ngram)")
    ap.add_argument("--runtime", default="native")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    items = [i for i in builtin_workload() if i.id == args.prompt_id]
    if not items:
        raise ConfigError(f"no built-in prompt {args.prompt_id!r}; ids look like open-chat-01")
    backend, codec = load_model(args.target, BackendConfig(dtype=args.dtype, runtime=args.runtime))
    ids = items[0].encode(codec, chat=True)
    proposer = build_proposer(args.draft, SpecConfig(k=None), target=backend)
    print(f"{args.prompt_id}: {len(ids)} prompt tokens, {args.runtime} {args.dtype}")
    for repeat in range(args.repeats):
        for name, engine in (("plain", Engine(backend)), (args.draft, Engine(backend, proposer, SpecConfig(k=None)))):
            trace = ListTrace()
            engine.generate(ids, SamplingParams(), StopConfig(max_tokens=args.max_tokens), trace).run()
            by_width = defaultdict(list)
            by_class = defaultdict(lambda: [0, 0, 0])  # draft class -> [drafts, drafted tokens, accepted]
            for step in trace.steps:
                by_width[len(step.drafted) + 1].append(step.timings["score"])
                if step.drafted:
                    counts = by_class[step.draft_class]
                    counts[0] += 1
                    counts[1] += len(step.drafted)
                    counts[2] += step.accepted
            widths = ", ".join(
                f"{w}: {1000 * statistics.median(v):.0f} ms (x{len(v)})" for w, v in sorted(by_width.items())
            )
            total = sum(sum(v) for v in by_width.values())
            print(f"repeat {repeat} {name}: target passes by width {widths}; target time {total:.2f} s", flush=True)
            if by_class:
                classes = sorted(by_class.items(), key=lambda i: str(i[0]))
                print(
                    "  drafts by class (drafts, tokens drafted, accepted): "
                    + ", ".join(f"{c}: {d[0]}, {d[1]}, {d[2]}" for c, d in classes)
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
