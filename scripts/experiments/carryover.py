"""Does a bench request run slower because of the request that ran just before it? Reads `spekula bench` results
and, on the prompts where no contender drafted anything (so every request is plain decoding in effect, on the same
prompts in every group), prints each contender's requests over the baseline's request of the same prompt and repeat,
grouped by the contender whose request ran right before it in the run (`nothing`: the first of a repeat).

    .venv/bin/python scripts/experiments/carryover.py docs/benchmarks/llamacpp/results.json.gz [more results ...]
    git show bd92ef5:docs/benchmarks/llamacpp/results.json.gz > /tmp/bd92ef5.json.gz   # an earlier docs run

Figures are geometric means of whole-request latency, TTFT and TPOT ratios; n is the number of requests.

Why it was written (2026-12-02, AVX-512 machine). Up to bd92ef5 the runner rotated one fixed order (plain,
llama-cpp-python, the default, plain-again), so the default always ran right after llama-cpp-python, and in four
docs runs in a row its open-chat median sat 0.3 to 4% under spekula plain's (0.966, 0.964, 0.968, 0.956 against
0.969, 0.983, 1.011, 0.990). Grouping requests by the contender that ran just before them first seemed to show a
carry-over from llama-cpp-python's request, but that grouping compared different prompts (the default drafts nothing
mostly on chat and prose, plain contenders on every category). On the same prompts (this script), the four docs
runs show every spekula contender 0 to 5% slower than llama-cpp-python there, whichever contender ran before it:

    docs run on   the default after llama-cpp-python   the default after plain   plain after plain-again
    b7a4d70       1.035 (n 12)                         1.030 (n 2)               1.015 (n 9)
    ba1ce51       1.018 (n 17)                         1.027 (n 4)               1.017 (n 15)
    9e31b24       1.014 (n 21)                         1.033 (n 5)               1.000 (n 20)
    bd92ef5       1.038 (n 21)                         1.036 (n 6)               1.015 (n 19)

and a run in the balanced order (open chat only, 8 repeats, 48 requests a contender; `spekula bench --categories
open-chat --per-category 6 --repeats 8 --max-tokens 256 --chat --spec loop=llama-cpp-python --spec
draft=suffix,k=auto --baseline llama-cpp-python`; `scripts/ratios.py RESULTS --over plain --interval`) had the
default at 1.000x spekula plain [95% interval 0.975, 1.017], its time per token 0.998x, and its median 0.999x
llama-cpp-python against plain's 0.985x (`--over llama-cpp-python`). So no
carry-over is shown: the place a contender runs in is not what costs the default in open chat; a single run's median
of 18 requests moves by a few percent on this host. The runner's balanced order (spekula.bench.runner.balanced_order)
stays: it guarantees what the fixed rotation did not, that no contender always runs after the same one.
"""

import collections
import gzip
import json
import math
import statistics
import sys
from pathlib import Path


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def main(paths: list[str]) -> None:
    for path in paths:
        result = load(Path(path))
        baseline = result.get("baseline") or "plain"
        requests = sorted(
            (r for r in result["requests"] if not r.get("error")), key=lambda r: (r["repeat"], r["order"])
        )
        before = {}  # id(request) -> the contender whose request ran right before it (the run's order, not the block's)
        for previous, r in zip([None, *requests], requests, strict=False):
            same_repeat = previous is not None and previous["repeat"] == r["repeat"]
            before[id(r)] = previous["config"] if same_repeat else "nothing"  # caches are forgotten between repeats
        blocks: dict[tuple[str, int], list[dict]] = collections.defaultdict(list)
        for r in requests:
            blocks[(r["prompt_id"], r["repeat"])].append(r)
        ratios: dict[tuple[str, str], dict[str, list[float]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )
        for block in blocks.values():
            base = next((r for r in block if r["config"] == baseline), None)
            if base is None or any((r.get("stats") or {}).get("drafted", 0) for r in block):
                continue  # only prompts where every contender decoded plainly: the same prompts in every group
            for r in block:
                if r is base:
                    continue
                for field in ("latency_s", "ttft_s", "tpot_s"):
                    if r.get(field) and base.get(field):
                        ratios[(r["config"], before[id(r)])][field].append(math.log(r[field] / base[field]))
        print(f"{path}: prompts no contender drafted on, each request over {baseline}'s (geometric means)")
        print(f"  {'contender':<18} {'ran right after':<18} {'latency':>8} {'TTFT':>7} {'TPOT':>7} {'n':>4}")
        for (name, previous), fields in sorted(ratios.items()):
            gm = {f: math.exp(statistics.fmean(v)) for f, v in fields.items()}
            print(
                f"  {name:<18} {previous:<18} {gm['latency_s']:>8.3f} {gm.get('ttft_s', math.nan):>7.3f} "
                f"{gm.get('tpot_s', math.nan):>7.3f} {len(fields['latency_s']):>4}"
            )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
