"""What a pass costs on a thread that serves, by where the model was loaded (spekula.threads): `loader`
loads it (and prefills --context tokens) on the main thread, which keeps its OpenMP team, as the server did;
`passing` loads it on a thread that ends (spekula.threads.on_passing_thread), as the server does now. Either
way a second thread, like the server's scheduler thread, then times --passes one-token passes on the shared
llama.cpp context the server uses. Each mode runs in a fresh process (a team, once made, stays for the
thread's life), alternating, --rounds times. Prints the median milliseconds per mode and round, then one
JSON line.

Usage (a catalogue name or a .gguf path; loads the weights, downloads nothing):

    .venv/bin/python scripts/thread_cost.py [--rounds 3] [--passes 12] [--context 600] [--threads 2] [MODEL]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

MODES = ("loader", "passing")
TOKEN = 5  # fed at every position: what is fed does not change the cost of a pass


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per mode, alternating")
    ap.add_argument("--passes", type=int, default=12, help="timed one-token passes per process")
    ap.add_argument("--context", type=int, default=600, help="tokens in the cache before the timed passes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one process's part
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b")
    args = ap.parse_args(argv)
    if min(args.rounds, args.passes, args.context, args.threads) < 1:
        ap.error("--rounds, --passes, --context and --threads must be >= 1")
    return args


def measure(args: argparse.Namespace) -> float:
    """One process's part: load (where --mode says), then the median one-token pass on a second thread."""
    from spekula.config import BackendConfig
    from spekula.pipeline import load_model
    from spekula.threads import on_passing_thread

    def load():
        backend, _ = load_model(
            args.model, BackendConfig(runtime="llamacpp", threads=args.threads, parallel=2, exact=False)
        )
        seq = backend.new_sequence()
        seq.forward([TOKEN] * args.context, num_logits=1)
        return seq

    seq = load() if args.mode == "loader" else on_passing_thread(load)
    times: list[float] = []

    def serve() -> None:
        for _ in range(args.passes):
            start = time.perf_counter()
            seq.forward([TOKEN])
            times.append(time.perf_counter() - start)
            seq.truncate(args.context)

    worker = threading.Thread(target=serve)
    worker.start()
    worker.join()
    return 1000 * statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode:
        print(json.dumps({"mode": args.mode, "ms": measure(args)}))
        return 0
    ms: dict[str, list[float]] = {mode: [] for mode in MODES}
    common = ["--passes", str(args.passes), "--context", str(args.context), "--threads", str(args.threads)]
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, *common, "--mode", mode, args.model],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            ms[mode].append(round(json.loads(out.strip().splitlines()[-1])["ms"], 1))
    for mode in MODES:
        print(f"{mode}: one-token pass {statistics.median(ms[mode]):.1f} ms median (rounds {ms[mode]})")
    print(json.dumps({"model": args.model, "context": args.context, "threads": args.threads, "ms": ms}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
