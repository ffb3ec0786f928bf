"""What each way exact mode may run attention costs on this build: a verified block by its width and a prompt's
prefill, by context length (spekula.backends.llamacpp._exact_attentions; docs/decisions/
0013-exact-attention-without-flash.md).

For every way the installed build offers, the GGUF is loaded in exact mode with that way alone (its load-time checks
run as usual and print the exact width found), then: the median of --repeats timed passes of each width after
300 and 1500 tokens of this file's text (rolled back after each), and the median of 3 whole prefills of 300 and 1500
tokens. The ways run one after another in one process, so the host's drift between them is not controlled: run it
twice. `--decode`: the ways loaded all at once instead, each decoding 96 tokens one pass a token after 60, 300 and
1400 tokens, round after round in alternating order (the drift and the order of loading then fall on every way
alike): ms a token, median over the rounds. An experiment, not a maintained tool (scripts/experiments/README.md).

    .venv/bin/python scripts/experiments/exact_attention.py [--model qwen2.5-coder-1.5b] [--repeats 7]
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/exact_attention.py --decode [--rounds 4]
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
DECODE_CONTEXTS = (60, 300, 1400)
DECODE_TOKENS = 96


def load_way(model: str, config: BackendConfig, way):
    """The model in exact mode with `way` the only way offered (its load-time checks run as usual)."""
    everything = llamacpp._exact_attentions
    llamacpp._exact_attentions = lambda patches, threads, heads: [way]
    try:
        return load_model(model, config)
    finally:
        llamacpp._exact_attentions = everything


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


def decode_cost(backend, ids: list[int], context: int) -> float:
    """ms a token of DECODE_TOKENS one-token passes after `context` tokens of ids, in a fresh sequence."""
    seq = backend.new_sequence()
    seq.prefill(ids[:context])
    start = time.perf_counter()
    for i in range(context, context + DECODE_TOKENS):
        seq.forward(ids[i : i + 1])
    ms = 1000 * (time.perf_counter() - start) / DECODE_TOKENS
    seq.release()
    return ms


def decode_interleaved(loaded: list[tuple[object, object]], ids: list[int], rounds: int) -> None:
    """--decode: every way's decoding cost at each of DECODE_CONTEXTS, the ways taking turns round after round."""
    costs: dict[tuple[int, int], list[float]] = {}
    for r in range(rounds):
        order = list(enumerate(loaded)) if r % 2 == 0 else list(enumerate(loaded))[::-1]
        for context in DECODE_CONTEXTS:
            for i, (_, backend) in order:
                costs.setdefault((i, context), []).append(decode_cost(backend, ids, context))
    print("way | " + " | ".join(f"a token after {c}" for c in DECODE_CONTEXTS) + " (ms, median of the rounds)")
    for i, (way, _) in enumerate(loaded):
        cells = [statistics.median(costs[(i, c)]) for c in DECODE_CONTEXTS]
        print(f"{way} | " + " | ".join(f"{c:.1f}" for c in cells), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--decode", action="store_true", help="one-token decoding, the ways loaded at once, interleaved")
    ap.add_argument("--rounds", type=int, default=4, help="--decode's rounds")
    args = ap.parse_args()
    ways = llamacpp._exact_attentions(llamacpp_check.installed_patches(), args.threads, 12)  # 12: Qwen2.5-1.5B's heads
    config = BackendConfig(runtime="llamacpp", threads=args.threads, exact=True, context_length=4096)
    if args.decode:
        loaded = []
        for way in ways:
            backend, codec = load_way(args.model, config, way)
            loaded.append((way, backend))
        decode_interleaved(loaded, codec.encode(open(__file__).read() * 20), args.rounds)
        return 0
    print("way | exact width | " + " | ".join(f"{w} rows at {c}" for c in CONTEXTS for w in WIDTHS) + " | "
          + " | ".join(f"prefill {c}" for c in CONTEXTS) + " (ms)")  # fmt: skip
    for way in ways:
        backend, codec = load_way(args.model, config, way)
        ids = codec.encode(open(__file__).read() * 20)
        cells = [ms for context in CONTEXTS for ms in block_costs(backend, ids, context, args.repeats)]
        cells += [prefill_cost(backend, ids[:context]) for context in CONTEXTS]
        print(f"{way} | {backend.exact_width} | " + " | ".join(f"{c:.0f}" for c in cells), flush=True)
        del backend
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
