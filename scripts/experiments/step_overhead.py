"""What a plain greedy step costs outside llama_decode: spekula's loop (engine, text layer, backend) against
llama-cpp-python's `Llama.generate`, on the same GGUF (Qwen2.5-Coder-1.5B Q4_K_M), prompt and tokens, through the
bench's two contenders (`spekula.bench.runner.Contender`, `spekula.bench.reference.ReferenceContender`) in one process,
alternating requests. Every llama_decode is timed (llama_cpp._internals.LlamaContext.decode), and spekula's stages
are timed by wrapping its functions (a wrapper adds ~1 µs to each), so `outside llama_decode` is the Python around
each pass, the detokenizer included on both sides.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/step_overhead.py [TOKENS]   # ~1 min

The wrapped stages are read right after a pass that streamed ~1 GB of weights through the caches, which is
why they cost several times what a microbenchmark of the same call in a loop finds (torch.tensor([]) 2 µs
there).

2026-12-01 (AVX-512 machine, 200 tokens, µs per token), before and after commit 304505c (greedy verification
without torch operators, the logits view kept per context), measured with throwaway copies of these wrappers on
spekula's loop alone while a one-token pass took 31 to 34 ms:
- spekula, outside llama_decode: 523 -> 346 (llama-cpp-python's loop, timed the same way: 266 to 335);
- Generation._accept (verify_greedy): 197 -> 80, of which torch.tensor 46 and greedy_token 72 before;
- LlamaCppBackend._decode around llama_decode: 195 -> 140 (numpy's ctypes view of the logits, made at
  every pass, 58 of it before);
- the incremental detokenizer, the same on both sides: 49 to 54.
This script on 304505c, later that session, with a pass at ~40 ms on a slower, noisier host (everything
~1.5x dearer): outside llama_decode 676 against llama-cpp-python's 516, Generation._accept 163, the
detokenizer 93 against 116; llama_decode itself 39.9 against 40.1 ms. So spekula's loop still spends
~0.15 ms a token more than llama-cpp-python's around the same pass, ~0.4% of it.
"""

import collections
import statistics
import sys
import time

import llama_cpp._internals as internals

import spekula.backends.llamacpp as llamacpp
import spekula.engine as engine
import spekula.text as text
from spekula.bench.reference import LLAMA_CPP_PYTHON, LlamaCppPythonLoop, LlamaSettings, ReferenceContender
from spekula.bench.runner import SpecChoice, build_contenders, parse_spec
from spekula.config import BackendConfig, SamplingParams, StopConfig
from spekula.pipeline import load_model

TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
seconds: dict[str, float] = collections.defaultdict(float)


def timed(owner, name: str, key: str) -> None:
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)


timed(internals.LlamaContext, "decode", "llama_decode")
timed(llamacpp.LlamaCppBackend, "_decode", "LlamaCppBackend._decode")
timed(engine.Generation, "plan", "Generation.plan")
timed(engine.Generation, "_accept", "Generation._accept")
timed(engine.Generation, "_advance", "Generation._advance")
timed(text.IncrementalDetokenizer, "feed", "IncrementalDetokenizer.feed")

backend, codec = load_model("qwen2.5-coder-1.5b", BackendConfig(runtime="llamacpp", threads=2, context_length=4096))
(plain,) = build_contenders(backend, codec, [SpecChoice("none", 0)], None)
(choice,) = parse_spec(f"loop={LLAMA_CPP_PYTHON}", "none", None)
reference = ReferenceContender(choice, LlamaCppPythonLoop(LlamaSettings.of(backend), codec, model=backend.model))
prompt = codec.encode("Write a long story about a lighthouse keeper who")
stop = StopConfig(max_tokens=TOKENS, ignore_eos=True)
for contender in (plain, reference):  # warm-up
    contender.start(prompt, SamplingParams(), StopConfig(max_tokens=4, ignore_eos=True)).result()
per_token: dict[str, dict[str, list[float]]] = {plain.name: {}, reference.name: {}}
for repeat in range(4):
    for contender in (plain, reference) if repeat % 2 == 0 else (reference, plain):
        contender.forget("")
        seconds.clear()
        start = time.perf_counter()
        done = contender.start(prompt, SamplingParams(), stop).result()
        total = time.perf_counter() - start
        n = len(done.token_ids)
        row = per_token[contender.name]
        row.setdefault("outside llama_decode", []).append((total - seconds["llama_decode"]) / n * 1e6)
        for key, value in seconds.items():
            row.setdefault(key, []).append(value / n * 1e6)
for name, row in per_token.items():
    print(f"{name} (µs per token, median of {len(row['outside llama_decode'])} requests of {TOKENS} tokens):")
    for key, values in row.items():
        print(f"  {key:30s} {statistics.median(values):9.1f}")
