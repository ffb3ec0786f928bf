"""Seconds per forward pass of S tokens (S = 1, 2, 5, 9 unless --widths) after a context of --context
tokens, per model: the median of --repeats timed passes, each after one untimed warm-up pass.

    .venv/bin/python scripts/pass_costs.py --dtype float32 [--runtime native|llamacpp] [--context 450] [--widths 1,9,17,33]
"""

import argparse
import statistics
import time

from spekula.config import BackendConfig
from spekula.pipeline import load_model

ap = argparse.ArgumentParser()
ap.add_argument("--dtype", default="float32")
ap.add_argument("--threads", type=int, default=None)
ap.add_argument("--runtime", default="transformers", help="transformers, native or llamacpp")
ap.add_argument("--context", type=int, default=60, help="tokens in the cache before the timed pass")
ap.add_argument("--repeats", type=int, default=1)
ap.add_argument("--widths", default="1,2,5,9", help="comma-separated block widths S to time")
ap.add_argument("models", nargs="*", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
args = ap.parse_args()
for name in args.models:
    backend, codec = load_model(name, BackendConfig(dtype=args.dtype, threads=args.threads, runtime=args.runtime))
    ids = codec.encode("def fibonacci(n):\n    " * (args.context // 4 + 1))[: args.context]
    seq = backend.new_sequence()
    seq.forward(ids, num_logits=1)
    seq.forward([5])  # warm-up
    seq.truncate(len(ids))
    for n in [int(w) for w in args.widths.split(",")]:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            seq.forward([5] * n)
            times.append(time.perf_counter() - start)
            seq.truncate(len(ids))
        ms = 1000 * statistics.median(times)
        print(f"{name} {args.runtime} {args.dtype} context={len(ids)} S={n}: {ms:.0f} ms", flush=True)
