"""Seconds per forward pass of S tokens (S = 1, 2, 5, 9) after a ~60-token context, per model.

    .venv/bin/python scripts/pass_costs.py --dtype float32 [--runtime native|llamacpp]
"""

import argparse
import time

from spekula.config import BackendConfig
from spekula.pipeline import load_model

ap = argparse.ArgumentParser()
ap.add_argument("--dtype", default="float32")
ap.add_argument("--threads", type=int, default=None)
ap.add_argument("--runtime", default="transformers", help="transformers, native or llamacpp")
ap.add_argument("models", nargs="*", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
args = ap.parse_args()
for name in args.models:
    backend, codec = load_model(name, BackendConfig(dtype=args.dtype, threads=args.threads, runtime=args.runtime))
    ids = codec.encode("def fibonacci(n):\n    " * 10)
    seq = backend.new_sequence()
    seq.forward(ids, num_logits=1)
    for n in (1, 1, 2, 5, 9):  # the first 1 warms up
        start = time.perf_counter()
        seq.forward([5] * n)
        print(f"{name} {args.runtime} {args.dtype} S={n}: {1000 * (time.perf_counter() - start):.0f} ms", flush=True)
        seq.truncate(len(ids))
