"""Does spekula's default (suffix drafting, k=auto) make llama.cpp's one-token passes slower than its plain decoding
does, where it drafts almost nothing? The bench's two contenders (`spekula.bench.runner.Contender`: spekula plain and
the default) on the same GGUF (Qwen2.5-Coder-1.5B Q4_K_M, 2 threads) in one process, on the built-in suite's first
three open-chat and creative-writing prompts (chat template, 128 tokens), each prompt under both before the next, the
order alternating, twice. Every llama_decode of a one-token batch is timed (llama_cpp._internals.LlamaContext.decode),
and each contender's wall time per output token.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/one_token_passes.py   # ~2 min

2026-12-02 (AVX-512 machine, commit 2bcb7ab), one-token llama_decode median, plain against the default, then wall
time per output token: a throwaway first version on open chat's prompts 01 to 06, 34.85 against 34.02 ms, 39.73
against 39.27 ms; this script before it printed each request, 35.47 against 34.71 ms, 41.10 against 45.26 ms; this
script, 30.79 against 30.61 ms, 35.44 against 35.21 ms (its requests swung from -8% to +12% between the two contenders
with nothing drafted). So the default's one-token passes were no slower than plain decoding's in any run, and its time
per token is the host's noise: one run of three had it 10% dearer, the others 1% cheaper. The docs run on 2bcb7ab's open
chat, where the default reads 0.979x over spekula plain (TPOT 1.021x, the A/A 1.000x) while drafting 13 tokens in 18
requests, does not come from the passes themselves.
"""

import collections
import statistics
import time

import llama_cpp._internals as internals

from spekula.bench.runner import SpecChoice, build_contenders
from spekula.bench.workloads import builtin_workload
from spekula.config import BackendConfig, SamplingParams, StopConfig
from spekula.pipeline import load_model

one_token: dict[str, list[float]] = collections.defaultdict(list)
running: list[str] = []  # the contender whose request is running
decode = internals.LlamaContext.decode


def timed_decode(context, batch):
    start = time.perf_counter()
    try:
        return decode(context, batch)
    finally:
        if running and batch.batch.n_tokens == 1:
            one_token[running[0]].append(time.perf_counter() - start)


internals.LlamaContext.decode = timed_decode

backend, codec = load_model("qwen2.5-coder-1.5b", BackendConfig(runtime="llamacpp", threads=2, context_length=4096))
contenders = build_contenders(backend, codec, [SpecChoice("none", 0), SpecChoice("suffix", None)], None)
items = [w for w in builtin_workload() if w.category in ("open-chat", "creative-writing") and w.id[-2:] <= "03"]
for contender in contenders:  # warm-up
    contender.start(items[0].encode(codec, chat=True), SamplingParams(), StopConfig(max_tokens=4)).result()
wall: dict[str, float] = collections.defaultdict(float)
tokens: dict[str, int] = collections.defaultdict(int)
for repeat in range(2):
    for item in items:
        for contender in contenders if repeat % 2 == 0 else contenders[::-1]:
            contender.forget("")
            running[:] = [contender.name]
            start = time.perf_counter()
            done = contender.start(item.encode(codec, chat=True), SamplingParams(), StopConfig(max_tokens=128)).result()
            seconds = time.perf_counter() - start
            wall[contender.name] += seconds
            tokens[contender.name] += len(done.token_ids)
            running.clear()
            n, stats = len(done.token_ids), done.stats
            print(
                f"{item.id} {contender.name}: {n} tokens, {seconds / n * 1e3:.1f} ms a token, "
                f"TTFT {stats.ttft_s:.2f} s, drafted {stats.drafted}, accepted {stats.accepted}"
            )
for name, seconds in one_token.items():
    print(
        f"{name}: {len(seconds)} one-token passes, median {statistics.median(seconds) * 1e3:.2f} ms; "
        f"wall time per output token {wall[name] / tokens[name] * 1e3:.2f} ms"
    )
