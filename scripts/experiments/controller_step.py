"""What `--k auto`'s controller costs a step where nothing is drafted: AdaptiveK.choose_k and AdaptiveK.observe in a
loop, over the pass costs calibrated on the AVX-512 machine (docs/BENCHMARKS.md), for requests that draft the way open
chat does under the suffix proposer (a short match at most steps, now and then none, drafts that the cost model keeps
plain). No model runs: this is the controller's own Python, timed warm, the best of 5 runs of 4 requests x 256 steps.

    .venv/bin/python scripts/experiments/controller_step.py                          # this checkout
    PYTHONPATH=<other checkout>/src .venv/bin/python scripts/experiments/controller_step.py   # another commit

Inside a real request the same calls cost 2 to 3 times as much, read right after a pass that streamed ~1 GB of
weights through the caches (scripts/experiments/step_overhead.py --speculative times them there).

2026-12-02 (AVX-512 machine), µs per step, choose_k + observe, three runs of each, alternating: commit 5656d46 (three
best_k searches a step, each target_cost call scaling a width by the drift or interpolating anew, abc Sequence checks)
40.7, 40.3, 40.7; the commit after it (target_cost from a table built once per change of the costs, the plain step's
reason in one pass over k, lists told from numbers without the abc check) 13.4, 12.5, 12.5. Later, with the table
built through the same per-width function as an observation's (CostModel._seconds_now), on a noisier host: 5656d46
46.8, 78.4, 46.1 against 16.4, 16.0, 24.1.
"""

import random
import time

from spekula.control import AdaptiveK
from spekula.cost import CostModel
from spekula.proposers.base import NO_DRAFT

COSTS_MS = {1: 28.5, 2: 51.6, 3: 66.2, 4: 78.6, 5: 106, 8: 143.5, 9: 141.4, 12: 164.7, 13: 180.2, 16: 148.4, 17: 203.2}
# what the suffix proposer offers at a step of an open-chat request, and how often (its draft classes)
OFFERS = {NO_DRAFT: 2, "suffix-1": 5, "suffix-2..3": 3, "suffix-4..7": 1, "recall-1": 1}


def run(seed: int, requests: int = 4, steps: int = 256) -> float:
    rng = random.Random(seed)
    costs = CostModel()
    costs.target_s = {n: ms / 1000 for n, ms in COSTS_MS.items()}
    costs.calibrated = dict(costs.target_s)
    costs._calibrated_at = 0
    offers, weights = list(OFFERS), list(OFFERS.values())
    spent, timed = 0.0, 0
    for _ in range(requests):
        controller = AdaptiveK(costs, k_max=16)
        for step in range(steps):
            draft_class = rng.choices(offers, weights)[0]
            pass_s = costs.calibrated[1] * rng.uniform(0.9, 1.2)
            start = time.perf_counter()
            k = controller.choose_k(steps - step, 0, draft_class)
            drafted = min(k, 3)  # what the suffix proposer had: a short match's continuation
            controller.observe(k, drafted, drafted // 2, 1e-4, pass_s, 0, draft_class)
            spent += time.perf_counter() - start
            timed += 1
    return spent / timed * 1e6


if __name__ == "__main__":
    print(f"choose_k + observe: {min(run(seed) for seed in range(5)):.1f} µs a step")
