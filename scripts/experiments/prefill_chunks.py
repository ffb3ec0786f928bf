"""Exact mode's K cache type against how a prompt is chunked: whether a prompt prefilled in other chunks gives the
next tokens the same logits, bit for bit, whether blocks still score as one-token passes, and what a prefill costs.

With K in F16 (the project's build, patch 0003) a prompt pass of 64 rows or more takes ggml's tiled flash-attention
kernel and a narrower one the one-row kernel, so chunkings whose passes are all 64 rows or more agree and one with a
narrower pass does not; with K in Q8_0 every prompt row takes the one-row kernel. The record:
docs/decisions/0012-prefill-chunks.md. About 3 minutes a K type for the 1.5B.

    .venv/bin/python scripts/experiments/prefill_chunks.py f16|q8_0 [MODEL]
"""

import statistics
import sys
import time

import torch

import spekula.backends.llamacpp as llamacpp
from spekula import llamacpp_check
from spekula.config import BackendConfig
from spekula.pipeline import load_model

KIND = sys.argv[1] if len(sys.argv) > 1 else "f16"
MODEL = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b"
CHUNKINGS = {  # prompt length: chunkings, the first a whole prefill
    700: [[700], [64, 636], [100] * 7, [300, 400], [640, 60]],
    200: [[200], [64, 136], [136, 64], [100, 100], [150, 50]],
    1500: [[1500], [256] * 5 + [220], [700, 800]],
}


def main() -> None:
    if KIND == "q8_0":  # as on a build without the split-KV patch
        llamacpp_check.installed_patches = lambda package=None: frozenset()
    config = BackendConfig(runtime="llamacpp", threads=2, context_length=4096, exact=True)
    backend, codec = load_model(MODEL, config)
    print(f"K {'F16' if backend.exact_f16_k else 'Q8_0'}, exact width {backend.exact_width}", flush=True)
    prompt = codec.encode(open(llamacpp.__file__).read() * 4)
    block = codec.encode(" The median of a list is the middle value after sorting it, and when the list has")[:17]

    def next_logits(chunks: list[int]) -> torch.Tensor:
        seq, at = backend.new_sequence(), 0
        for size in chunks:  # each chunk in passes of its own (Sequence.prefill), narrower ones included
            seq.prefill(prompt[at : at + size])
            at += size
        logits = seq.forward(prompt[at : at + 1] + block[:8])
        seq.release()
        return logits

    for n, chunkings in CHUNKINGS.items():
        whole = next_logits(chunkings[0])
        for chunks in chunkings[1:]:
            got = next_logits(chunks)
            verdict = "equal" if torch.equal(got, whole) else f"differs, max {float((got - whole).abs().max()):.3g}"
            print(f"prompt {n} in chunks {chunks}: {verdict} to a whole prefill", flush=True)
    for n in (100, 600, 1500):
        seq = backend.new_sequence()
        seq.prefill(prompt[:n])
        single = torch.cat([seq.forward([t]) for t in block])
        marks = []
        for width in (2, 4, 8, 17):
            seq.truncate(n)
            marks.append(f"{width}{'=' if torch.equal(seq.forward(block[:width]), single[:width]) else 'x'}")
        print(f"blocks after {n}: {' '.join(marks)} ('=': as one-token passes)", flush=True)
        seq.release()
    for n in (300, 700, 1500):
        times = []
        for _ in range(3):
            seq = backend.new_sequence()
            start = time.perf_counter()
            seq.prefill(prompt[:n])
            times.append(time.perf_counter() - start)
            seq.release()
        print(f"prefill of {n} tokens: {1000 * statistics.median(times):.0f} ms (median of 3)", flush=True)


if __name__ == "__main__":
    main()
