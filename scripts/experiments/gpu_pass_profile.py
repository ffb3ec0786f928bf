"""What one target pass of the native runner costs on a GPU, by width, with no engine around it; then
where a one-token and a five-token pass spend their time (torch.profiler, host and device).

The Qwen2.5-Coder-1.5B shapes with random bf16 weights (scripts/gpu_bench.py's RANDOM_SHAPES: real
weights do not travel to a lent GPU), a cache of 48 tokens, each width timed over 20 passes after 3
warm-up ones; every pass is forward + truncate back to the 48 tokens, with its logits copied to the
host (as the engine does). docs/BENCHMARKS.md (GPU) cites one run:

    python3 scripts/experiments/gpu_pass_profile.py           # CUDA, bf16
    python3 scripts/experiments/gpu_pass_profile.py --tiny    # CPU smoke test: a tiny fp32 model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "scripts")]

from spekula.backends.native import NativeBackend, Transformer  # noqa: E402
from spekula.config import BackendConfig  # noqa: E402

import gpu_bench  # noqa: E402

CONTEXT = 48
WIDTHS = (1, 2, 5, 9, 17)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny fp32 model on the CPU (the smoke test)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = "float32" if args.tiny else "bfloat16"
    shapes = gpu_bench.TINY if args.tiny else gpu_bench.RANDOM_SHAPES["qwen2.5-coder-1.5b"]
    weights = gpu_bench.random_weights(shapes, gpu_bench.TORCH_DTYPES[dtype], device)
    model = Transformer.from_state_dict(shapes, weights).to(device)
    backend = NativeBackend(model, "random", BackendConfig(dtype=dtype, runtime="native"), max_cache_len=512)
    seq = backend.new_sequence()
    seq.forward(list(range(100, 100 + CONTEXT)), num_logits=1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def passes(width: int, count: int) -> None:
        for _ in range(count):
            seq.forward([5] * width)
            seq.truncate(CONTEXT)

    for width in WIDTHS:
        passes(width, 3)
        sync()
        start = time.perf_counter()
        passes(width, args.repeats)
        sync()
        print(f"S={width}: {(time.perf_counter() - start) / args.repeats * 1000:.2f} ms a pass", flush=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for width in (1, 5):
        with profile(activities=activities) as prof:
            passes(width, 5)
            sync()
        for key in ["cpu_time_total"] + (["cuda_time_total"] if device.type == "cuda" else []):
            print(f"--- S={width}, 5 passes, by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60))
    seq.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
