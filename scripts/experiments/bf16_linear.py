"""What one bf16 linear layer costs for S rows on this CPU, by every route PyTorch offers here.

A verify pass is cheap only if S rows cost about what one row costs. In bf16 on a CPU without
native bf16 (AVX2 only), PyTorch's one-row path is a memory-bound matrix-vector kernel, and its
several-row path is not. This prints, for one Qwen2.5-1.5B-sized weight (gate and up projections,
17920 x 1536) and S = 1, 2, 5, 9, the median milliseconds of:

- F.linear in bf16 (what the native runner and transformers run);
- oneDNN's packed bf16 weights (what makes fp32 cheap here), or the reason it refuses;
- the fp32 copy of the same weight (twice the bytes);
- upcasting the bf16 weight to fp32 in chunks that stay in cache, then fp32 matmul (the only
  other route without a compiled kernel).

An experiment, not a maintained tool (scripts/experiments/README.md).

    .venv/bin/python scripts/experiments/bf16_linear.py [--threads 2]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def median_ms(fn, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def chunked(x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    """x @ weight^T with weight upcast to fp32 `rows` output rows at a time."""
    out = torch.empty(x.shape[0], weight.shape[0])
    buffer = torch.empty(rows, weight.shape[1])
    for r in range(0, weight.shape[0], rows):
        part = buffer[: min(rows, weight.shape[0] - r)]
        part.copy_(weight[r : r + rows])
        out[:, r : r + rows] = x @ part.t()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__}, CPU capability {capability}, {args.threads} threads")
    weight = (torch.randn(17920, 1536) * 0.02).bfloat16()
    weight32 = weight.float()
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    except RuntimeError as e:
        packed = None
        print(f"oneDNN packed bf16: refused ({str(e).splitlines()[0]})")
    for s in (1, 2, 5, 9):
        x = torch.randn(s, 1536)
        xb = x.bfloat16()
        row = [
            f"S={s}: bf16 F.linear {median_ms(lambda: F.linear(xb, weight)):.1f} ms",
            f"fp32 {median_ms(lambda: F.linear(x, weight32)):.1f} ms",
            f"bf16 upcast in chunks of 512 rows {median_ms(lambda: chunked(x, weight, 512)):.1f} ms",
        ]
        if packed is not None:
            ms = median_ms(lambda: torch.ops.mkldnn._linear_pointwise(xb, packed, None, "none", [], ""))
            row.append(f"oneDNN packed bf16 {ms:.1f} ms")
        print(", ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
