"""Replay greedy outputs through n-gram lookup offline: how many tokens per target pass (τ) the
lookup would give, and what decode speedup that means at given pass costs, for `--k auto` and fixed k.

Greedy output does not depend on the proposer, so the plain-decoding outputs of a `spekula bench`
run (its results.json) are the outputs of every n-gram configuration too. Each step is replayed:
the proposer drafts from the committed context, the draft is accepted up to its first token that
differs from the real output, and the step costs one target pass of its width (--costs, seconds per
pass of n tokens, e.g. measured by scripts/pass_costs.py). Prefill is left out: the speedup printed
is decode time only, an upper bound on what the request as a whole gains.

    .venv/bin/python scripts/ngram_replay.py docs/benchmarks/full-length/results.json \\
        --costs 1:0.58,2:0.60,5:0.66,9:0.80 --k auto,2,4,8
"""

import argparse
import json

from spekula.bench.workloads import parse_lines
from spekula.config import SamplingParams
from spekula.control import AdaptiveK, CostModel, FixedK
from spekula.models import resolve
from spekula.proposers.ngram import NgramProposer
from spekula.text import TextCodec


def replay(prompt: list[int], output: list[int], controller, costs: CostModel, ngram_max: int, ngram_min: int) -> tuple[float, int]:
    """(decode seconds, target passes) of n-gram speculation that produces `output` after `prompt`."""
    proposer = NgramProposer(ngram_max, ngram_min)
    pos, seconds, passes = 0, 0.0, 0
    while pos < len(output):
        k = min(controller.choose_k(len(output) - pos, 0), len(output) - pos - 1)
        draft = proposer.propose(prompt + output[:pos], k, SamplingParams(), None).tokens if k > 0 else []
        accepted = 0
        while accepted < len(draft) and draft[accepted] == output[pos + accepted]:
            accepted += 1
        controller.observe(k, len(draft), accepted, 0.0, None)
        seconds += costs.target_cost(len(draft) + 1)
        passes += 1
        pos += accepted + 1
    return seconds, passes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a spekula bench results.json (its plain-decoding outputs are replayed)")
    ap.add_argument("--costs", required=True, help="seconds per target pass by width, as n:s,n:s,... (at least n = 1)")
    ap.add_argument("--k", default="auto,8", help="comma-separated: auto and/or fixed k values")
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=1)
    args = ap.parse_args()

    table = {int(n): float(s) for n, s in (pair.split(":") for pair in args.costs.split(","))}
    result = json.load(open(args.results))
    items = parse_lines([json.dumps(item) for item in result["workload"]["items"]], "results.json", "default")
    by_id = {item.id: item for item in items}
    codec = TextCodec.load(resolve(result["target"]).hf_dir)
    chat = bool(result["manifest"]["config"].get("chat"))

    plain = [r for r in sorted(result["requests"], key=lambda r: r["order"]) if r["config"] == result["baseline"] and r["repeat"] == 0]
    policies = [p.strip() for p in args.k.split(",") if p.strip()]
    print("prompt | tokens | " + " | ".join(f"k={p}: τ, decode speedup" for p in policies))
    costs = CostModel(target_s=dict(table), frozen=True)  # one engine: alpha carries from prompt to prompt, as in a run
    for r in plain:
        prompt = by_id[r["prompt_id"]].encode(codec, chat=chat)
        cells = []
        for p in policies:
            controller = AdaptiveK(costs) if p == "auto" else FixedK(int(p))
            seconds, passes = replay(prompt, r["token_ids"], controller, costs, args.ngram_max, args.ngram_min)
            cells.append(f"{len(r['token_ids']) / passes:.2f}, {len(r['token_ids']) * table[1] / seconds:.2f}x")
        print(f"{r['prompt_id']} | {len(r['token_ids'])} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
