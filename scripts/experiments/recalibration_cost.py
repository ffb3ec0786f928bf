"""What one re-measurement of the pass costs takes on llama.cpp, and which requests of a docs run look as if they paid
for one.

Without arguments: `CostModel.calibrate` for k_max = 16 (the widths `Engine.remeasure_if_stale` times when
`CostModel.stale()` says the table drifted), three times, on Qwen2.5-Coder-1.5B Q4_K_M, 2 threads. Until commit
7ae91ef, `Engine.new_controller` ran it when a request started, so the caller of that request waited for it, and
a server's running requests stalled; since, only a server re-measures, on its worker thread while idle. With a
`spekula bench` results file (run with spekula plain, `plain-again` and the default, `suffix k=auto`): on open chat
and creative writing, the largest times per token over spekula plain's of every contender, and the default's
requests that took over a second longer than spekula plain's on the same prompt, with what they drafted and the
steps the default's engine had taken by their end (a re-measurement needed 256, then 512, 1024, ... steps since the
last).

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/recalibration_cost.py   # ~30 s
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/recalibration_cost.py --after  # ~2 min
    .venv/bin/python scripts/experiments/recalibration_cost.py docs/benchmarks/llamacpp/results.json.gz

2026-12-02 (AVX-512 machine, commit 1ef2430): 3.70, 3.32 and 3.48 s, with 13 widths timed (1 to 9 twice each, 12,
13, 16, 17 once). In that docs run the default's time per token over spekula plain's, on the 36 open-chat and
creative-writing requests, had five values from 1.23 to 1.53 where plain-again's largest was 1.23 and
llama-cpp-python's 1.21, and three open-chat requests of the default took 1.1 to 1.9 s longer than spekula plain's.
Those were NOT re-measurements: a request's clock (Generation's) started after `new_controller` returned, so no
measured time held one (the requests' passes themselves ran slower: `score_s` over `target_passes`); since commit
7ae91ef the clock starts when `Engine.generate` is called. `--after` (the default and plain engines on four
open-chat prompts of 96 tokens, a re-measurement after each of four rounds, a namespace per round; first run the
same day as a throwaway, on 7ae91ef)
found the default's passes as fast after a re-measurement as before: 29 to 31 ms a pass in the first round, 27 to
36 after (36 with a 3-token draft), spekula plain's 28 to 32 throughout. Its committed form, rerun on the review
commit after 4a087bc: after each re-measurement the default's passes took 26.9 to 32.9 ms and spekula plain's 26.5
to 31.9 (no drafts); the first round, before any, 32.5 to 41.1 against 32.7 to 37.8 (the default drafting 5 to 11
tokens a request).
"""

import gzip
import json
import sys
import time
from collections import defaultdict

PLAIN, DEFAULT = "plain", "suffix k=auto"
QUIET = ("open-chat", "creative-writing")  # the categories where the default drafts next to nothing


def suspects(path: str) -> None:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        requests = json.load(f)["requests"]
    by = defaultdict(dict)
    for r in requests:
        by[(r["prompt_id"], r["repeat"])][r["config"]] = r
    for name in sorted({r["config"] for r in requests} - {PLAIN}):
        tpot = sorted(m[name]["tpot_s"] / m[PLAIN]["tpot_s"] for (pid, _), m in by.items() if pid.startswith(QUIET))
        print(
            f"{name}: time per token over spekula plain's, largest five of {len(tpot)}:",
            [round(x, 3) for x in tpot[-5:]],
        )
    steps = 0
    for r in sorted((r for r in requests if r["config"] == DEFAULT), key=lambda r: (r["repeat"], r["order"])):
        steps += sum(int(n) for n in r["stats"]["k_chosen"].values())
        extra = r["latency_s"] - by[(r["prompt_id"], r["repeat"])][PLAIN]["latency_s"]
        if extra > 1.0:
            print(
                f"{r['prompt_id']} repeat {r['repeat']}: +{extra:.2f} s, drafted {r['stats']['drafted']}, step {steps}"
            )


def timings() -> None:
    from spekula.config import BackendConfig
    from spekula.cost import CostModel, calibration_widths
    from spekula.pipeline import load_model

    backend, _ = load_model("qwen2.5-coder-1.5b", BackendConfig(runtime="llamacpp"))
    print("widths timed:", calibration_widths(16), "(dense), or every width up to 17 where that is cheap")
    for _ in range(3):
        costs = CostModel()
        start = time.perf_counter()
        costs.calibrate(backend, None, k_max=16)
        seconds = time.perf_counter() - start
        table = {n: round(1000 * s) for n, s in sorted(costs.target_s.items())}
        print(f"calibrate: {seconds:.2f} s; ms by width {table}")


def after() -> None:
    """Time per pass of the default and spekula plain on open-chat prompts, round by round, the default's pass costs
    measured again after each round: whether a re-measurement slows the passes that follow it."""
    from spekula.bench.runner import encode_items
    from spekula.bench.workloads import builtin_workload
    from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
    from spekula.pipeline import Pipeline

    pipe = Pipeline.load("qwen2.5-coder-1.5b", "suffix", SpecConfig(k=None), BackendConfig(runtime="llamacpp"))
    items = [i for i in builtin_workload() if i.category == "open-chat"][:4]
    ids = encode_items(items, pipe.codec, True)
    pipe.warmup()
    for round_ in range(4):
        for item in items:
            line = []
            for plain in (False, True):  # a namespace per round: no round drafts an earlier round's outputs
                stats = pipe.generate(
                    ids[item.id], SamplingParams(), StopConfig(max_tokens=96), plain=plain, namespace=f"round-{round_}"
                ).stats
                per_pass = 1000 * stats.score_s / max(1, stats.target_passes)
                line.append(f"{'plain' if plain else 'default'} {per_pass:.1f} ms/pass, drafted {stats.drafted}")
            print(f"round {round_} {item.id}: " + "; ".join(line), flush=True)
        start = time.perf_counter()
        pipe.engine.costs.calibrate(pipe.target, None, k_max=pipe.engine.spec.k_max)
        print(f"-- measured again in {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--after"]:
        after()
    elif len(sys.argv) > 1:
        suspects(sys.argv[1])
    else:
        timings()
