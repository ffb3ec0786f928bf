"""Which llama.cpp settings score a block of tokens bit for bit as one token at a time, at which context
lengths, and what a pass of each width costs: the record behind exact mode's settings
(spekula.backends.llamacpp's docstring).

For each setting (weight repacking on/off, flash attention on/off, K cache F16/Q8_0), a prompt of N tokens
is prefilled, 17 tokens are scored one at a time, then again as blocks of width w; '=' marks a block
bitwise equal to the one-token passes. Then the median of 7 timings of a pass of each width at N = 400.

    .venv/bin/python scripts/experiments/exact_kernels.py [MODEL]   # about 5 minutes for the 1.5B

2026-12-01, 2-core EPYC with AVX-512, Qwen2.5-Coder-1.5B Q4_K_M, 2 threads ('=' a block bitwise equal to
one-token passes, 'x' not; the run printed every K as Q8_0, a label bug since fixed, and the lines below
carry the right labels, in SETTINGS order):

    repack on,  flash on,  K F16,  prompt 100 and 250: 2= 3= 4x 7x 8x 16x 17x; 256 to 3000: all x
    repack on,  flash off, K F16,  prompt 100 to 3000: all x
    repack off, flash on,  K F16,  prompt 100: 2= 3= 4= 7= 8x 16x 17x; 250: 2= 3= 4= 7x 8x ...; 256 to 3000: all x
    repack on,  flash on,  K Q8_0, prompt 100 to 3000: 2= 3= 4x 7x 8x 16x 17x
    repack off, flash on,  K Q8_0, prompt 100 to 3000: 2= 3= 4= 7= 8x 16x 17x
    ms a pass at 400, by width 1, 2, 3, 4, 7, 8, 16:
    repack on,  flash on,  K F16:  29.2, 53.4, 71.0, 86.4, 140.6, 140.5, 169.6
    repack on,  flash off, K F16:  28.5, 54.3, 70.7, 86.4, 138.7, 139.8, 162.0
    repack off, flash on,  K F16:  36.0, 80.1, 98.8, 115.4, 168.7, 147.0, 163.7
    repack on,  flash on,  K Q8_0: 27.2, 51.6, 68.7, 85.4, 135.6, 137.8, 164.5
    repack off, flash on,  K Q8_0: 36.1, 81.3, 100.4, 117.0, 169.6, 147.7, 166.4

So: with K in F16 nothing is exact from 256 tokens on (the old exact mode: repacking off, K F16), as a
one-token pass then reads 512 KV cells and flash attention takes ggml's split-KV path, for one query
only; flash attention off is never exact past one token. With K in Q8_0 (which that path does not
take) blocks of up to 3 tokens are exact at every length on the repacked weights, up to 7 without
repacking; a verified row costs ~23 ms either way (68.7 / 3, 169.6 / 7), and only the repacked weights
keep the one-token pass at the default's price (27.2 against 36.1 ms). Exact mode takes that setting.
Those were the stock build's kernels; the project's build now patches the two that differ
(docs/decisions/0009-exact-kernels.md), and with it the setting is exact at every width to 17.
"""

import statistics
import sys
import time

import llama_cpp
import llama_cpp._internals as internals
import torch

from spekula.config import BackendConfig
from spekula.pipeline import load_model

MODEL = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
SETTINGS = [  # (repacking, flash attention, K cache type)
    (True, True, llama_cpp.GGML_TYPE_F16),
    (True, False, llama_cpp.GGML_TYPE_F16),
    (False, True, llama_cpp.GGML_TYPE_F16),
    (True, True, llama_cpp.GGML_TYPE_Q8_0),
    (False, True, llama_cpp.GGML_TYPE_Q8_0),
]
LENGTHS = (100, 250, 256, 300, 700, 1500, 3000)
WIDTHS = (2, 3, 4, 7, 8, 16, 17)


def load(repack: bool, type_k: int):
    class Model(internals.LlamaModel):
        def __init__(self, *a, params=None, **kw):
            params.use_extra_bufts = repack
            super().__init__(*a, params=params, **kw)

    class Context(internals.LlamaContext):
        def __init__(self, *, model, params, verbose):
            params.type_k = type_k
            super().__init__(model=model, params=params, verbose=verbose)

    internals.LlamaModel, internals.LlamaContext = Model, Context
    return load_model(MODEL, BackendConfig(runtime="llamacpp", threads=2, context_length=4096))


def main() -> None:
    base_model, base_context = internals.LlamaModel, internals.LlamaContext
    text = open(__file__).read() * 8
    for repack, flash, type_k in SETTINGS:
        backend, codec = load(repack, type_k)
        backend.flash_attention, backend.flash_min_rows = flash, 0  # flash attention in every pass, or in none
        backend._pool = [backend._new_context(4096)]  # with this flash attention and K type
        internals.LlamaModel, internals.LlamaContext = base_model, base_context
        prompt = codec.encode(text)
        tokens = codec.encode(" The median of a list is the middle value after sorting it, and when the list has")[:17]
        kind = "Q8_0" if type_k == llama_cpp.GGML_TYPE_Q8_0 else "F16"
        name = f"repack {'on' if repack else 'off'}, flash {'on' if flash else 'off'}, K {kind}"
        for n in LENGTHS:
            seq = backend.new_sequence()
            seq.forward(prompt[:n], num_logits=1)
            single = torch.cat([seq.forward([t]) for t in tokens])
            marks = []
            for w in WIDTHS:
                seq.truncate(n)
                marks.append(f"{w}{'=' if torch.equal(seq.forward(tokens[:w]), single[:w]) else 'x'}")
            print(f"{name}, prompt {n}: {' '.join(marks)}", flush=True)
            seq.release()
        seq = backend.new_sequence()
        seq.forward(prompt[:400], num_logits=1)
        costs: dict[int, list[float]] = {}
        for _ in range(7):
            for w in (1, 2, 3, 4, 7, 8, 16):
                seq.truncate(400)
                start = time.perf_counter()
                seq.forward(tokens[:w])
                costs.setdefault(w, []).append(time.perf_counter() - start)
        seq.release()
        print(f"{name}, ms at 400: " + ", ".join(f"{w}: {1000 * statistics.median(v):.1f}" for w, v in costs.items()))
        del backend


if __name__ == "__main__":
    main()
