"""What each way exact mode may run attention costs on this build: a verified block by its width and a prompt's
prefill, by context length (spekula.backends.llamacpp._exact_attentions; docs/decisions/
0013-exact-attention-without-flash.md).

For every way the installed build offers, the GGUF is loaded in exact mode with that way alone (its load-time checks
run as usual and print the exact width found), then: the median of --repeats timed passes of each width after
300 and 1500 tokens of this file's text (rolled back after each), and the median of 3 whole prefills of 300 and 1500
tokens. The ways run one after another in one process, so the host's drift between them is not controlled: run it
twice. An experiment, not a maintained tool (scripts/experiments/README.md).

    .venv/bin/python scripts/experiments/exact_attention.py [--model qwen2.5-coder-1.5b] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

from spekula import llamacpp_check
from spekula.backends import llamacpp
from spekula.config import BackendConfig
from spekula.pipeline import load_model

CONTEXTS = (300, 1500)
WIDTHS = (1, 4, 16)


def block_costs(backend, ids: list[int], context: int, repeats: int) -> list[float]:
    """ms a pass of each of WIDTHS costs after `context` tokens of ids (median of repeats, rolled back after each)."""
    seq = backend.new_sequence()
    seq.prefill(ids[:context])
    costs = []
    for width in WIDTHS:
        block = ids[context : context + width]
        times = []
        for _ in range(repeats + 1):  # the first warms up, untimed
            start = time.perf_counter()
            seq.forward(block)
            times.append(time.perf_counter() - start)
            seq.truncate(context)
        costs.append(1000 * statistics.median(times[1:]))
    seq.release()
    return costs


def prefill_cost(backend, prompt: list[int]) -> float:
    """ms a whole prefill of prompt costs in a fresh sequence (median of 3)."""
    times = []
    for _ in range(3):
        seq = backend.new_sequence()
        start = time.perf_counter()
        seq.prefill(prompt)
        times.append(time.perf_counter() - start)
        seq.release()
    return 1000 * statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    everything = llamacpp._exact_attentions
    ways = everything(llamacpp_check.installed_patches(), args.threads, 12)  # 12: Qwen2.5-1.5B's heads
    config = BackendConfig(runtime="llamacpp", threads=args.threads, exact=True, context_length=4096)
    print("way | exact width | " + " | ".join(f"{w} rows at {c}" for c in CONTEXTS for w in WIDTHS) + " | "
          + " | ".join(f"prefill {c}" for c in CONTEXTS) + " (ms)")  # fmt: skip
    for way in ways:
        llamacpp._exact_attentions = lambda patches, threads, heads, way=way: [way]
        try:
            backend, codec = load_model(args.model, config)
        finally:
            llamacpp._exact_attentions = everything
        ids = codec.encode(open(__file__).read() * 20)
        cells = [ms for context in CONTEXTS for ms in block_costs(backend, ids, context, args.repeats)]
        cells += [prefill_cost(backend, ids[:context]) for context in CONTEXTS]
        print(f"{way} | {backend.exact_width} | " + " | ".join(f"{c:.0f}" for c in cells), flush=True)
        del backend
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
