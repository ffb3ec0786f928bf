"""What finished requests' caches kept in llama.cpp's shared context cost the requests that run on, and what
parking them in host memory (PromptCache, Sequence.park) costs instead.

A server's prompt cache keeps finished conversations for their next turn. In the shared context (the server's
continuous batching: one unified KV cell pool) their cells stay in the pool, and every later pass builds its
attention mask over every cell in use, so a lone request decodes slower the more is kept. Parking copies a
kept sequence's cells to host memory (llama_state_seq_get_data) and frees them; a next turn copies them back
(llama_state_seq_set_data).

Per round, alternately with parking on and off (the order swapped every round): `--kept` conversations of
`--kept-tokens` tokens each are run and closed through one PromptCache, then a request of `--prompt` tokens
decodes `--steps` one-token passes; the median pass time of each mode is printed, then the time to park and
restore one conversation.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/parked_caches.py

Found (docs/BENCHMARKS.md, "Against llama-server, cold and warm": its parked caches), default arguments,
qwen2.5-coder-1.5b Q4_K_M, 2 threads: see there for the figures and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from spekula.backends import llamacpp
from spekula.config import BackendConfig
from spekula.pipeline import load_model
from spekula.prompt_cache import PromptCache


def tokens(seed: int, n: int, vocab: int = 30000) -> list[int]:
    return [(1000 + seed * 7919 + 37 * i) % vocab for i in range(n)]


def one_round(backend, parking: bool, args) -> float:
    """Median one-token pass (ms) of a request decoding beside `args.kept` closed conversations."""
    cache = PromptCache(backend, max_kept=args.kept)
    park = llamacpp.LlamaCppSequence.park
    if not parking:
        llamacpp.LlamaCppSequence.park = lambda self: False  # type: ignore[method-assign]
    try:
        for j in range(args.kept):
            seq = cache.open([])
            seq.forward(tokens(j + 1, args.kept_tokens), num_logits=1)
            cache.close(seq, reusable=True)
        seq = cache.open([])
        seq.forward(tokens(0, args.prompt), num_logits=1)
        times = []
        for i in range(args.steps):
            start = time.perf_counter()
            seq.forward([(5 + 7 * i) % 30000])
            times.append(time.perf_counter() - start)
        cache.close(seq, reusable=False)
    finally:
        llamacpp.LlamaCppSequence.park = park  # type: ignore[method-assign]
        cache.clear()
    return 1e3 * statistics.median(times)


def park_and_restore(backend, n: int) -> tuple[float, float]:
    """Seconds to park a sequence of n tokens and to restore it (after one warm-up of each)."""
    out = []
    for _ in range(3):
        seq = backend.new_sequence()
        seq.forward(tokens(9, n), num_logits=1)
        start = time.perf_counter()
        assert seq.park()
        parked_at = time.perf_counter()
        target = backend.new_sequence()
        assert seq.restore_into(target)
        out.append((parked_at - start, time.perf_counter() - parked_at))
        seq.release()
        target.release()
    return out[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=8, help="sequence ids of the shared context")
    parser.add_argument("--kept", type=int, default=6, help="finished conversations kept")
    parser.add_argument("--kept-tokens", type=int, default=600)
    parser.add_argument("--prompt", type=int, default=500)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    config = BackendConfig(runtime="llamacpp", threads=args.threads, parallel=args.parallel, context_length=2048)
    backend, _ = load_model(args.model, config)
    results: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for parking in (True, False) if r % 2 == 0 else (False, True):
            results[parking].append(one_round(backend, parking, args))
        print(f"round {r}: parked {results[True][-1]:.2f} ms a pass, kept in the context {results[False][-1]:.2f} ms")
    on, off = statistics.median(results[True]), statistics.median(results[False])
    print(
        f"median one-token pass beside {args.kept} x {args.kept_tokens} kept tokens: parked {on:.2f} ms, "
        f"in the context {off:.2f} ms ({off / on:.3f}x)"
    )
    park_s, restore_s = park_and_restore(backend, args.kept_tokens)
    print(f"{args.kept_tokens} tokens: park {1e3 * park_s:.1f} ms, restore {1e3 * restore_s:.1f} ms")


if __name__ == "__main__":
    main()
