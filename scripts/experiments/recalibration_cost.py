"""What one re-measurement of the pass costs takes on llama.cpp: `CostModel.calibrate` for k_max = 16 (the widths the
engine's `_measure(1)` times when `CostModel.stale()` says the table drifted), three times, on Qwen2.5-Coder-1.5B
Q4_K_M, 2 threads. `Engine.new_controller` runs it when a request starts, so the request it lands in pays it.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/recalibration_cost.py   # ~30 s

2026-12-02 (AVX-512 machine, commit 1ef2430): 3.70, 3.32 and 3.48 s, with 13 widths timed (1 to 9 twice each, 12,
13, 16, 17 once). An open-chat request of the docs run takes ~4 s, so one that starts on a stale table takes ~1.8x
as long. In that run the default's time per token over spekula plain's, on the 36 open-chat and creative-writing
requests, had five values from 1.23 to 1.53 where plain-again's largest was 1.23 and llama-cpp-python's 1.21.
The back-off (RECALIBRATE_GAP, doubling) allows at most about five re-measurements in such a run, so they explain
at most a few of those requests.
"""

import time

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
