"""What a batched pass costs in exact mode's shared context (a KV stream per sequence), by rows per sequence.

Loads the GGUF as a server does in exact mode (`parallel` sequences in one context, `kv_unified` off), prefills four
sequences with 300 tokens each, then times `forward_batch` over the four with the given rows per sequence (median of 5,
rolled back after each), beside the same rows in one sequence. llama.cpp runs such a batch as ubatches taking as many
rows of every sequence in them, so ragged rows cost a pass per distinct count: docs/decisions/0011-exact-batching.md.
An experiment, not a maintained tool (scripts/experiments/README.md).

    .venv/bin/python scripts/experiments/exact_batch_costs.py [--model qwen2.5-coder-1.5b] [--parallel 17]
"""

from __future__ import annotations

import argparse
import statistics
import time

from spekula.config import BackendConfig
from spekula.pipeline import load_model

SHAPES = ([1], [1, 1], [1, 1, 1, 1], [2, 2, 2, 2], [4, 4, 4, 4], [16], [1, 4, 2, 8], [1, 1, 1, 13])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--parallel", type=int, default=17, help="sequences in the shared context (a server's default)")
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    config = BackendConfig(
        runtime="llamacpp", threads=args.threads, exact=True, parallel=args.parallel, context_length=args.context_length
    )
    backend, _ = load_model(args.model, config)
    sequences = [backend.new_sequence() for _ in range(4)]
    for i, seq in enumerate(sequences):
        seq.prefill([1000 + i + j for j in range(300)])
    print("rows per sequence | ms (median of 5)")
    for shape in SHAPES:
        active = sequences[: len(shape)]
        times = []
        for _ in range(5):
            started = time.perf_counter()
            backend.forward_batch(active, [[7] * rows for rows in shape])
            times.append(time.perf_counter() - started)
            for seq, rows in zip(active, shape, strict=True):
                seq.truncate(seq.length - rows)
        print(f"{','.join(map(str, shape))} | {1000 * statistics.median(times):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
