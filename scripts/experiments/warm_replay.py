"""A warm server, replayed offline: what the suffix proposer's memory of earlier answers does to new requests.

`ngram_replay.py` replays a `spekula bench` run's greedy outputs through the engine; this replays them as a server
that has been running sees them. One engine (one cost model, one suffix-cache namespace) first serves every
request of the run except the held-out ones (--new), in the run's order, then the held-out ones. Each held-out
request is also replayed on a fresh engine (nothing remembered, nothing learnt), and per request the script prints
the decode speedup over plain decoding at the given pass costs, warm and cold, and what was drafted and accepted
per draft source (spekula.draft_class: the request's own text, earlier requests' outputs "recall", the copy
cursor after an edit "resync"), so a loss on a warm server can be traced to the drafts that cost it.

--spread prints instead, per request of the run (every one warm, in the run's order), how often the first token of
a draft of each source is accepted when the proposer drafts at every position (matches of one token left out): how
much requests differ from each other in what memory's drafts get, against what their own text's drafts get
(spekula.control.AdaptiveK.acceptance). --by-category holds every category out in turn and prints, per category,
the median and lowest speedup warm and cold (docs/decisions/0010-rates-per-request.md). --warm-on EARLIER replays
RESULTS's requests on a server that first served EARLIER's (prompts of another suite: held-out ones after the
built-in suite, docs/decisions/0023-short-recalls.md). --split prints first-token acceptance of the request's own
text's suffix drafts where the match's occurrences agree on the token and where they do not
(docs/decisions/0024-split-matches.md). An experiment, not a
maintained tool (scripts/experiments/README.md).

    .venv/bin/python scripts/experiments/warm_replay.py RESULTS.json.gz --costs 1:S1,2:S2,... \\
        --new open-chat,creative-writing,json-extraction-05
    .venv/bin/python scripts/experiments/warm_replay.py RESULTS.json.gz --spread
    .venv/bin/python scripts/experiments/warm_replay.py RESULTS.json.gz --split --max-tokens 96
    .venv/bin/python scripts/experiments/warm_replay.py RESULTS.json.gz --costs 1:S1,... --by-category --max-tokens 96
    .venv/bin/python scripts/experiments/warm_replay.py HELD-OUT.json.gz --costs 1:S1,... --warm-on RESULTS.json.gz \\
        --max-tokens 96

Found on docs/benchmarks/llamacpp-confirm at the AVX-512 pass costs (docs/benchmarks/llamacpp/pass_costs.txt):
memory's first-token acceptance spreads across requests from never to most of the time, by kind of request (a
JSON extraction's keys repeat, a chat answer's text does not), far wider than the request's own text's; and
before issue 34's change a request whose own text copies bet on memory's drafts on the strength of its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from spekula.config import SamplingParams, SpecConfig, StopConfig  # noqa: E402
from spekula.cost import CostModel  # noqa: E402
from spekula.draft_class import NO_DRAFT, draft_source  # noqa: E402
from spekula.proposers.suffix import SuffixConfig, SuffixProposer  # noqa: E402
from spekula.trace import ListTrace  # noqa: E402

from ngram_replay import NAMESPACE, ReplayBackend, Request, load_requests, replay_engine, truncated  # noqa: E402


def run(engine, request: Request) -> tuple[float, dict[str, list[int]]]:
    """Replay one request: (decode speedup over plain decoding, {source: [drafted, accepted]})."""
    backend: ReplayBackend = engine.target
    backend.expect(request.prompt, [*request.output, next(iter(backend.eos_token_ids))])
    trace = ListTrace()
    stop = StopConfig(max_tokens=request.budget)
    engine.generate(request.prompt, SamplingParams(), stop, trace, namespace=NAMESPACE).run()
    costs = engine.costs
    seconds = sum(costs.target_cost(width) for width in backend.widths)
    by_source: dict[str, list[int]] = {}
    for step in trace.steps:
        if step.drafted:
            counts = by_source.setdefault(draft_source(step.draft_class), [0, 0])
            counts[0] += len(step.drafted)
            counts[1] += step.accepted
    return request.emitted * costs.target_cost(1) / seconds, by_source


def fresh_engine(table: dict[int, float], vocab):
    """An engine that has served nothing: suffix drafting, k auto, at these pass costs (frozen)."""
    return replay_engine(
        "suffix", SpecConfig(k=None), CostModel(target_s=dict(table), frozen=True), ReplayBackend(*vocab)
    )


def after(earlier: list[Request], held: list[Request], table: dict[int, float], vocab) -> tuple[dict, dict]:
    """One engine serves `earlier` in order, then each of `held` (warm); each of `held` also on a fresh engine
    (cold). Prints a line per held request and returns the speedups {prompt id: x}, warm and cold."""
    server = fresh_engine(table, vocab)
    for request in earlier:
        run(server, request)
    warm: dict[str, float] = {}
    cold: dict[str, float] = {}
    print("prompt | warm | cold | warm: drafted/accepted by source")
    for request in held:
        warm[request.prompt_id], by_source = run(server, request)
        cold[request.prompt_id] = run(fresh_engine(table, vocab), request)[0]
        drafts = ", ".join(f"{source} {d}/{a}" for source, (d, a) in sorted(by_source.items()))
        print(f"{request.prompt_id} | {warm[request.prompt_id]:.3f}x | {cold[request.prompt_id]:.3f}x | {drafts}")
    return warm, cold


def warm_and_cold(requests: list[Request], new: list[str], table: dict[int, float], vocab) -> None:
    held = [r for r in requests if any(r.prompt_id.startswith(n) for n in new)]
    after([r for r in requests if r not in held], held, table, vocab)


def by_category(requests: list[Request], table: dict[int, float], vocab) -> None:
    """Every category held out in turn: one engine serves the run's other requests, then the category's (warm);
    each of them also on a fresh engine (cold). Per category, the median and lowest decode speedup over plain
    decoding; then the geometric mean over all requests."""
    categories = sorted({r.category for r in requests})
    warm: dict[str, float] = {}
    cold: dict[str, float] = {}
    for category in categories:
        server = fresh_engine(table, vocab)
        for request in requests:
            if request.category != category:
                run(server, request)
        for request in requests:
            if request.category == category:
                warm[request.prompt_id] = run(server, request)[0]
                cold[request.prompt_id] = run(fresh_engine(table, vocab), request)[0]
    print("category | warm median | warm lowest | cold median | cold lowest")
    for category in [*categories, "all"]:
        ids = [r.prompt_id for r in requests if category in ("all", r.category)]
        w, c = [warm[i] for i in ids], [cold[i] for i in ids]
        print(f"{category} | {statistics.median(w):.3f}x | {min(w):.3f}x | {statistics.median(c):.3f}x | {min(c):.3f}x")
    geo_w, geo_c = statistics.geometric_mean(warm.values()), statistics.geometric_mean(cold.values())
    print(f"geometric mean | {geo_w:.4f}x | | {geo_c:.4f}x |")


def held_out(requests: list[Request], earlier: list[Request], table: dict[int, float], vocab) -> None:
    """Prompts no earlier request resembles, on a warm server: `after` the requests of another run (`earlier`, e.g.
    the built-in suite's, in that run's order); then the median, lowest and geometric mean, warm and cold."""
    warm, cold = after(earlier, requests, table, vocab)
    for label, speedups in (("warm", warm), ("cold", cold)):
        values = list(speedups.values())
        print(
            f"{label}: median {statistics.median(values):.3f}x, lowest {min(values):.3f}x,"
            f" geometric mean {statistics.geometric_mean(values):.4f}x"
        )


def spread(requests: list[Request], vocab) -> None:
    factory = replay_engine("suffix", SpecConfig(k=None), CostModel(), ReplayBackend(*vocab)).proposer
    rates: dict[str, list[float]] = {}
    for request in requests:
        proposer, counts = factory.create(NAMESPACE), {}
        for pos in range(len(request.output)):
            context = request.prompt + request.output[:pos]
            draft_class = proposer.draft_class(context)
            if draft_class == NO_DRAFT or draft_class.length == 1:
                continue
            first = proposer.propose(context, 1, SamplingParams(), None).tokens
            seen = counts.setdefault(draft_source(draft_class), [0, 0])
            seen[0] += first == request.output[pos : pos + 1]
            seen[1] += 1
        proposer.draft_class(request.prompt + request.output)
        proposer.close()
        for source, (accepted, drafts) in counts.items():
            if drafts >= 3:
                rates.setdefault(source, []).append(accepted / drafts)
    print("source | requests | first-token acceptance per request: min, quartiles, max")
    for source, values in sorted(rates.items()):
        cuts = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        cells = ", ".join(f"{v:.2f}" for v in (min(values), *cuts, max(values)))
        print(f"{source} | {len(values)} | {cells}")


def split(requests: list[Request]) -> None:
    """Per category and match length: how often the first token of a suffix draft from the request's own text
    (cold: no memory, no copy cursor) is accepted where every occurrence of the match agrees on it, and where
    they disagree, which only SuffixDecoding's rule drafts (SuffixConfig.unanimous_first off):
    docs/decisions/0024-split-matches.md."""
    counts: dict[tuple[str, str, str], list[int]] = {}
    for request in requests:
        guess = SuffixProposer(SuffixConfig(cache_entries=0, unanimous_first=False))
        agreed = SuffixProposer(SuffixConfig(cache_entries=0))
        for pos in range(len(request.output)):
            context = request.prompt + request.output[:pos]
            guess._sync(context)
            agreed._sync(context)
            match = guess._lookup()
            if match is None:
                continue
            lengths = "1" if match.length == 1 else "2-7" if match.length < 8 else "8+"
            kind = "agree" if agreed._lookup() is not None else "split"
            seen = counts.setdefault((request.category, lengths, kind), [0, 0])
            seen[0] += match.tokens[0] == request.output[pos]
            seen[1] += 1
    print("category | match length | occurrences | first token accepted")
    totals: dict[tuple[str, str], list[int]] = {}
    for (category, lengths, kind), (accepted, drafts) in sorted(counts.items()):
        print(f"{category} | {lengths} | {kind} | {accepted}/{drafts}")
        total = totals.setdefault((lengths, kind), [0, 0])
        total[0], total[1] = total[0] + accepted, total[1] + drafts
    for (lengths, kind), (accepted, drafts) in sorted(totals.items()):
        print(f"all | {lengths} | {kind} | {accepted}/{drafts} = {accepted / drafts:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a spekula bench results.json[.gz] (its plain-decoding outputs are replayed)")
    ap.add_argument("--costs", help="seconds per target pass by width, as n:s,n:s,... (at least n = 1)")
    ap.add_argument("--new", default="open-chat,creative-writing", help="comma-separated prompt id prefixes held out")
    ap.add_argument("--spread", action="store_true", help="instead: first-token acceptance per request and source")
    ap.add_argument(
        "--split",
        action="store_true",
        help="instead: first-token acceptance where the match's occurrences agree on it and where they do not",
    )
    ap.add_argument(
        "--by-category",
        action="store_true",
        help="instead: every category held out in turn, median and lowest speedup warm and cold",
    )
    ap.add_argument(
        "--warm-on",
        metavar="EARLIER",
        help="instead: a server warmed on EARLIER (another results file) serves every request of RESULTS",
    )
    ap.add_argument(
        "--max-tokens",
        type=int,
        help="replay only each output's first N tokens, as a run with max_tokens N would have emitted them",
    )
    args = ap.parse_args()
    requests, vocab = load_requests(args.results)
    earlier = load_requests(args.warm_on)[0] if args.warm_on else []
    if args.max_tokens:
        requests, earlier = (
            [truncated(r, args.max_tokens) for r in requests],
            [truncated(r, args.max_tokens) for r in earlier],
        )
    if args.spread:
        spread(requests, vocab)
        return 0
    if args.split:
        split(requests)
        return 0
    if not args.costs:
        ap.error("give --costs (or --spread, --split)")
    table = {int(n): float(s) for n, s in (pair.split(":") for pair in args.costs.split(","))}
    if args.by_category:
        by_category(requests, table, vocab)
        return 0
    if args.warm_on:
        held_out(requests, earlier, table, vocab)
        return 0
    warm_and_cold(requests, [n.strip() for n in args.new.split(",") if n.strip()], table, vocab)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
