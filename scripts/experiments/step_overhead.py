"""What a plain greedy step costs outside llama_decode: spekula's loop (engine, text layer, backend) against
llama-cpp-python's `Llama.generate`, on the same GGUF (Qwen2.5-Coder-1.5B Q4_K_M), prompt and tokens, through the
bench's two contenders (`spekula.bench.runner.Contender`, `spekula.bench.reference.ReferenceContender`) in one process,
alternating requests. Every llama_decode is timed (llama_cpp._internals.LlamaContext.decode), and spekula's stages
are timed by wrapping its functions (a wrapper adds ~1 µs to each), so `outside llama_decode` is the Python around
each pass, the detokenizer included on both sides.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/step_overhead.py [TOKENS] [--speculative]
        # ~1 min; --speculative adds spekula's default (suffix drafting, k=auto) as a third contender, with
        # its proposer's and controller's stages timed, and prints what each of its requests drafted

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

2026-12-02 (AVX-512 machine, commit 5715042 plus this option), `200 --speculative`: the default drafted 63 to 67
tokens in ~10 of ~155 steps. Outside llama_decode, per pass: the default 940 µs, spekula plain 533, llama-cpp-python
464 (llama_decode ~33 ms a token). Per token, the default against plain: Generation.plan 119 against 21 (the suffix
lookup, SuffixProposer.draft_class, 49; AdaptiveK.choose_k 54), Generation._advance 45 against 15 (the suffix tree's
update, SuffixProposer.observe, 30), Generation.complete 217 against 162 (AdaptiveK.observe 27). So the speculative
loop's own Python costs ~1.2% of a pass more than the plain loop's, which a category that drafts nothing pays.
"""

import collections
import statistics
import sys
import time

import llama_cpp._internals as internals

import spekula.backends.llamacpp as llamacpp
import spekula.control as control
import spekula.engine as engine
import spekula.proposers.suffix as suffix
import spekula.text as text
from spekula.bench.reference import LLAMA_CPP_PYTHON, LlamaCppPythonLoop, LlamaSettings, ReferenceContender
from spekula.bench.runner import SpecChoice, build_contenders, parse_spec
from spekula.config import BackendConfig, SamplingParams, StopConfig
from spekula.pipeline import load_model

TOKENS = int(next((a for a in sys.argv[1:] if a.isdigit()), 200))
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
SPECULATIVE = "--speculative" in sys.argv[1:]
if SPECULATIVE:
    timed(engine.Generation, "complete", "Generation.complete")
    timed(suffix.SuffixProposer, "draft_class", "SuffixProposer.draft_class")
    timed(suffix.SuffixProposer, "observe", "SuffixProposer.observe")
    timed(control.AdaptiveK, "choose_k", "AdaptiveK.choose_k")
    timed(control.AdaptiveK, "observe", "AdaptiveK.observe")

backend, codec = load_model("qwen2.5-coder-1.5b", BackendConfig(runtime="llamacpp", threads=2, context_length=4096))
choices = [SpecChoice("none", 0)] + ([SpecChoice("suffix", None)] if SPECULATIVE else [])
(plain, *speculative) = build_contenders(backend, codec, choices, None)
(choice,) = parse_spec(f"loop={LLAMA_CPP_PYTHON}", "none", None)
reference = ReferenceContender(choice, LlamaCppPythonLoop(LlamaSettings.of(backend), codec, model=backend.model))
prompt = codec.encode("Write a long story about a lighthouse keeper who")
stop = StopConfig(max_tokens=TOKENS, ignore_eos=True)
contenders = [plain, reference, *speculative]
for contender in contenders:  # warm-up
    contender.start(prompt, SamplingParams(), StopConfig(max_tokens=4, ignore_eos=True)).result()
per_token: dict[str, dict[str, list[float]]] = {c.name: {} for c in contenders}
for repeat in range(4):
    for contender in contenders if repeat % 2 == 0 else contenders[::-1]:
        contender.forget("")
        seconds.clear()
        start = time.perf_counter()
        done = contender.start(prompt, SamplingParams(), stop).result()
        total = time.perf_counter() - start
        n = len(done.token_ids)
        if contender in speculative:
            ks = dict(sorted(done.stats.k_chosen.items()))
            print(f"{contender.name}: drafted {done.stats.drafted}, steps by k {ks}")
        row = per_token[contender.name]
        row.setdefault("outside llama_decode", []).append((total - seconds["llama_decode"]) / n * 1e6)
        passes = done.stats.target_passes or n  # llama-cpp-python's loop counts none: one pass a token
        row.setdefault("outside llama_decode, per pass", []).append((total - seconds["llama_decode"]) / passes * 1e6)
        for key, value in seconds.items():
            row.setdefault(key, []).append(value / n * 1e6)
for name, row in per_token.items():
    print(f"{name} (µs per token, median of {len(row['outside llama_decode'])} requests of {TOKENS} tokens):")
    for key, values in row.items():
        print(f"  {key:30s} {statistics.median(values):9.1f}")
