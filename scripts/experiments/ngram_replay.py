"""Replay greedy outputs through n-gram lookup offline: how many tokens per target pass (τ) the
lookup would give, and what decode speedup that means at given pass costs, for `--k auto` and fixed k.

Greedy output does not depend on the proposer, so the plain-decoding outputs of a `spekula bench`
run (its results.json) are the outputs of every n-gram configuration too. Each step is replayed:
the proposer drafts from the committed context, the draft is accepted up to its first token that
differs from the real output, and the step costs one target pass of its width (--costs, seconds per
pass of n tokens, e.g. measured by scripts/pass_costs.py). Prefill is left out: the speedup printed
is decode time only, an upper bound on what the request as a whole gains. An experiment, not a
maintained tool (scripts/experiments/README.md).

--by-class prints instead how often n-gram drafts are accepted by draft class (the matched
length) and draft position, over every position of the outputs: what `--k auto` learns.

    .venv/bin/python scripts/experiments/ngram_replay.py RESULTS.json --costs 1:S1,2:S2,5:S5,9:S9 --k auto,2,4,8

where Sn is the seconds a target pass of n tokens takes (scripts/pass_costs.py prints them in ms).
"""

import argparse
import json
import statistics

from spekula.bench.workloads import parse_lines
from spekula.config import SamplingParams
from spekula.control import AdaptiveK, FixedK
from spekula.cost import POSITIONS, CostModel
from spekula.models import resolve
from spekula.proposers.base import NO_DRAFT
from spekula.proposers.ngram import NgramProposer
from spekula.text import TextCodec


def replay(
    prompt: list[int],
    output: list[int],
    controller,
    costs: CostModel,
    ngram_max: int,
    ngram_min: int,
    classes: bool = True,
) -> tuple[float, int]:
    """(decode seconds, target passes) of n-gram speculation that produces `output` after `prompt`.
    classes False: every match in one draft class (acceptance is still learnt by draft position)."""
    proposer = NgramProposer(ngram_max, ngram_min)
    pos, seconds, passes = 0, 0.0, 0
    while pos < len(output):
        context = prompt + output[:pos]
        draft_class = proposer.draft_class(context)
        if not classes and draft_class != NO_DRAFT:
            draft_class = None
        k = min(controller.choose_k(len(output) - pos, 0, draft_class), len(output) - pos - 1)
        draft = proposer.propose(context, k, SamplingParams(), None).tokens if k > 0 else []
        accepted = 0
        while accepted < len(draft) and draft[accepted] == output[pos + accepted]:
            accepted += 1
        controller.observe(k, len(draft), accepted, 0.0, None, 0, draft_class)
        seconds += costs.target_cost(len(draft) + 1)
        passes += 1
        pos += accepted + 1
    return seconds, passes


def acceptance_by_class(
    prompt: list[int],
    output: list[int],
    k: int,
    ngram_max: int,
    ngram_min: int,
    counts: dict,
) -> None:
    """At every position of `output`, draft k tokens and count, per draft class (the matched length)
    and draft position i, how often position i was reached (every earlier token accepted) and accepted:
    counts[class][i] = [accepted, reached]."""
    proposer = NgramProposer(ngram_max, ngram_min)
    for pos in range(len(output)):
        context = prompt + output[:pos]
        draft_class = proposer.draft_class(context)
        if draft_class == NO_DRAFT:
            continue
        rows = counts.setdefault(draft_class, [[0, 0] for _ in range(POSITIONS)])
        draft = proposer.propose(context, min(k, len(output) - pos), SamplingParams(), None).tokens
        for i, token in enumerate(draft):
            row = rows[min(i, POSITIONS - 1)]
            row[1] += 1
            if token != output[pos + i]:
                break
            row[0] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a spekula bench results.json (its plain-decoding outputs are replayed)")
    ap.add_argument("--costs", help="seconds per target pass by width, as n:s,n:s,... (at least n = 1)")
    ap.add_argument(
        "--by-class",
        action="store_true",
        help="instead: acceptance by draft class and position, drafting 8 tokens everywhere",
    )
    ap.add_argument("--k", default="auto,8", help="comma-separated: auto and/or fixed k values")
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=1)
    ap.add_argument(
        "--one-class", action="store_true", help="every match in one draft class, not one class per matched length"
    )
    ap.add_argument(
        "--prior-weight",
        type=float,
        default=AdaptiveK.prior_weight,
        help="AdaptiveK's prior_weight: how many of a request's own drafts the engine-wide rates count as "
        f"(default {AdaptiveK.prior_weight})",
    )
    ap.add_argument(
        "--k-max", type=int, default=AdaptiveK.k_max, help=f"k=auto's longest draft (default {AdaptiveK.k_max})"
    )
    args = ap.parse_args()

    if not args.by_class and not args.costs:
        ap.error("give --costs (or --by-class)")
    result = json.load(open(args.results))
    items = parse_lines([json.dumps(item) for item in result["workload"]["items"]], "results.json", "default")
    by_id = {item.id: item for item in items}
    codec = TextCodec.load(resolve(result["target"]).hf_dir)
    chat = bool(result["manifest"]["config"].get("chat"))

    requests = sorted(result["requests"], key=lambda r: r["order"])
    plain = [r for r in requests if r["config"] == result["baseline"] and r["repeat"] == 0]
    if args.by_class:
        counts: dict[str, list[list[int]]] = {}
        for r in plain:
            prompt = by_id[r["prompt_id"]].encode(codec, chat=chat)
            acceptance_by_class(prompt, r["token_ids"], 8, args.ngram_max, args.ngram_min, counts)
        positions = [f"position {i + 1}" + ("+" if i == POSITIONS - 1 else "") for i in range(POSITIONS)]
        print("draft class | " + " | ".join(positions))
        for draft_class in sorted(counts, reverse=True):
            cells = [f"{a / n:.2f} of {n}" if n else "-" for a, n in counts[draft_class]]
            print(f"{draft_class} | " + " | ".join(cells))
        return 0
    table = {int(n): float(s) for n, s in (pair.split(":") for pair in args.costs.split(","))}
    policies = [p.strip() for p in args.k.split(",") if p.strip()]
    print("prompt | tokens | " + " | ".join(f"k={p}: τ, decode speedup" for p in policies))
    costs = CostModel(target_s=dict(table), frozen=True)  # one engine: alpha carries from prompt to prompt, as in a run
    speedups: dict[str, dict[str, list[float]]] = {p: {} for p in policies}  # policy -> category -> per prompt
    for r in plain:
        prompt = by_id[r["prompt_id"]].encode(codec, chat=chat)
        cells = []
        for p in policies:
            if p == "auto":
                controller = AdaptiveK(costs, k_max=args.k_max, prior_weight=args.prior_weight)
            else:
                controller = FixedK(int(p))
            seconds, passes = replay(
                prompt, r["token_ids"], controller, costs, args.ngram_max, args.ngram_min, not args.one_class
            )
            speedup = len(r["token_ids"]) * table[1] / seconds
            speedups[p].setdefault(r["category"], []).append(speedup)
            cells.append(f"{len(r['token_ids']) / passes:.2f}, {speedup:.2f}x")
        print(f"{r['prompt_id']} | {len(r['token_ids'])} | " + " | ".join(cells))
    print("\ncategory | " + " | ".join(f"k={p}: median, worst" for p in policies))
    for category in speedups[policies[0]]:
        cells = [
            f"{statistics.median(speedups[p][category]):.3f}x, {min(speedups[p][category]):.3f}x" for p in policies
        ]
        print(f"{category} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
