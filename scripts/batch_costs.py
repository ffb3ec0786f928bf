"""What one batched llama.cpp pass costs: milliseconds per pass over B sequences of S new tokens each
(the server's continuous batching: one llama_decode in the shared context), after a cache of --context
tokens per sequence. Each figure is the fastest of --repeats passes; the caches are truncated back
after every pass. --attention default times the shared context with llama.cpp's default attention
kernel instead of its flash-attention kernel (llamacpp.SHARED_FLASH_ATTENTION, the server's). Prints
one line per shape, then one JSON line.

    B x S: MS ms (T tokens/s)

Usage (a catalogue name or a .gguf path; loads the weights, downloads nothing):

    .venv/bin/python scripts/batch_costs.py [--shapes 1x1,4x1,1x4,16x1] [--context 300] [--repeats 3]
        [--threads 2] [--attention flash|default] [MODEL]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

from spekula.backends import llamacpp
from spekula.config import BackendConfig
from spekula.pipeline import load_model

TOKEN = 5  # fed at every position: what is fed does not change the cost of a pass


def shapes(text: str) -> list[tuple[int, int]]:
    """'1x1,4x1' -> [(1, 1), (4, 1)]: (sequences, tokens each), each at least 1."""
    try:
        parsed = [tuple(int(n) for n in part.split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        parsed = []
    if not parsed or any(len(p) != 2 or min(p) < 1 for p in parsed):
        raise argparse.ArgumentTypeError(f"shapes are BxS pairs such as 1x1,4x1,1x4; got {text!r}")
    return parsed  # type: ignore[return-value]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=shapes, default=shapes("1x1,4x1,1x4,16x1"))
    ap.add_argument("--context", type=int, default=300, help="tokens in each sequence's cache before the timed pass")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per shape; the fastest is printed")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--attention", choices=["flash", "default"], default="flash", help="llama.cpp's attention kernel in the context"
    )
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b")
    args = ap.parse_args(argv)
    if args.context < 1 or args.repeats < 1:
        ap.error("--context and --repeats must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    widest = max(b for b, _ in args.shapes)
    llamacpp.SHARED_FLASH_ATTENTION = args.attention == "flash"
    config = BackendConfig(runtime="llamacpp", threads=args.threads, parallel=max(widest, 2), exact=False)
    backend, _ = load_model(args.model, config)
    sequences = [backend.new_sequence() for _ in range(widest)]
    backend.forward_batch(sequences, [[TOKEN] * args.context] * widest, [1] * widest)
    timed = {}
    for b, s in args.shapes:
        batch = sequences[:b]
        best = None
        for _ in range(args.repeats + 1):  # the first pass of a shape warms it up
            start = time.perf_counter()
            backend.forward_batch(batch, [[TOKEN] * s] * b)
            seconds = time.perf_counter() - start
            best = seconds if best is None else min(best, seconds)
            for seq in batch:
                seq.truncate(args.context)
        timed[f"{b}x{s}"] = best * 1000
        print(f"{b} x {s}: {best * 1000:.0f} ms ({b * s / best:.1f} tokens/s)", flush=True)
    for seq in sequences:
        seq.release()
    print(json.dumps({"model": args.model, "context": args.context, "attention": args.attention, "ms": timed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
