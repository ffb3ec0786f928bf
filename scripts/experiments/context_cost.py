"""A one-token llama_decode in spekula's plain llama.cpp context against llama-cpp-python's `Llama.eval`, same GGUF
(Qwen2.5-Coder-1.5B Q4_K_M), same process, same context size and threads, alternating blocks of 16 passes as the
context grows: is spekula's pass dearer than llama-cpp-python's, and is it the configuration or the process?

    .venv/bin/python scripts/experiments/context_cost.py [reference-first | throwaway-first] [--second-context]
        [--shared-weights]   # about half a minute; GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for 2 MiB pages

throwaway-first loads (and frees) a llama-cpp-python model before spekula's and the reference.
--second-context times a second spekula context on the same model as a third contender; --shared-weights gives
the reference the model spekula's backend loaded (spekula.bench.reference.shared_weights, as `spekula bench` does).

2026-12-01 (AVX-512 machine), two runs each way, median ms per pass (spekula against llama-cpp-python):
- spekula's model loaded first: 25.36 against 24.06 and 25.46 against 24.63 (slower in every block pair);
- llama-cpp-python's loaded first: 25.69 against 25.76 and 24.21 against 24.81;
- a throwaway model loaded and freed first, then spekula's, then llama-cpp-python's: 24.88 against 23.90 (so it
  is not a first load that is slow: the model loaded last ran fastest in all five runs).
Python outside llama_decode costs spekula 0.15 ms a pass; both contexts reuse the graph (llama_perf_context:
n_reused 31 of 32); kv_unified off and n_gpu_layers 0 changed nothing. So the model loaded later in a process
runs ~3% faster, whichever it is (why, this does not find); `spekula bench` loads spekula's first, which hands
llama-cpp-python's loop that ~3% (its time per token there is 1.02x to 1.04x below spekula plain's on the same passes).

Found the next session: it is the page size. With GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (the weights on 2 MiB
pages, as the `spekula` program now runs: spekula.hugepages), 28.70 against 28.57 and 28.45 against 28.41 ms
with spekula's model loaded first, 28.97 against 28.94 and 29.83 against 29.53 with llama-cpp-python's first.

The session after (2026-12-01, another AVX-512 machine, 2 MiB pages, five processes each; spekula, its second
context, llama-cpp-python):
- two models: 28.82 / - / 29.06, 25.96 / - / 26.33, 28.93 / - / 28.09, 27.61 / - / 27.33, 27.81 / - / 27.84,
  27.29 / - / 27.20, then with --second-context 28.26 / 28.50 / 28.64, 28.79 / 29.00 / 28.82,
  **32.63 / 32.57 / 30.71**, 28.08 / 28.63 / 28.80, 36.78 / 37.73 / 37.33: in one process of eleven both of
  spekula's contexts ran 6% slower than llama-cpp-python's copy of the model, and agreed with each other;
- --second-context --shared-weights: 29.52 / 29.60 / 28.95, 34.73 / 34.90 / 35.15, **31.87 / 33.32 / 33.49**,
  31.69 / 32.44 / 32.15, 32.55 / 32.38 / 32.37: one process of five had one context 4.5% faster than the other
  two, which share its weights.
So a whole process can hand one contender a few percent for the run, through where its weights and (less clearly)
its context landed in memory; this machine's host was also noisy (passes from 26 to 37 ms between processes).
`spekula bench` therefore gives its llama-cpp-python contender the weights spekula's backend loaded, which removes
the first of the two.
"""

import statistics
import sys
import time

from llama_cpp import Llama

from spekula.bench.reference import shared_weights
from spekula.config import BackendConfig
from spekula.models.cache import gguf_dir
from spekula.models.catalogue import CATALOGUE
from spekula.pipeline import load_model

MODEL = "qwen2.5-coder-1.5b"
gguf = str(gguf_dir() / CATALOGUE[MODEL].gguf_file)
args = sys.argv[1:]


def reference(model=None) -> Llama:
    with shared_weights(model):
        return Llama(
            model_path=gguf, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2, use_mmap=False,
            verbose=False,
        )  # fmt: skip


def spekula_backend():
    return load_model(MODEL, BackendConfig(runtime="llamacpp", threads=2, context_length=4096))


if "throwaway-first" in args:
    throwaway = reference()
    del throwaway
    backend, codec = spekula_backend()
    ll = reference()
elif "reference-first" in args:
    ll = reference()
    backend, codec = spekula_backend()
else:
    backend, codec = spekula_backend()
    ll = reference(backend.model if "--shared-weights" in args else None)
prompt = codec.encode("Write a long story about a lighthouse keeper. " * 8)
sequences = {"spekula": backend.new_sequence()}
if "--second-context" in args:
    sequences["spekula, second context"] = backend.new_sequence()
for seq in sequences.values():
    seq.forward(prompt, 1)
ll.reset()
ll.eval(prompt)
token = codec.encode(" the")[0]
names = [*sequences, "llama-cpp-python"]
ms: dict[str, list[float]] = {name: [] for name in names}
for block in range(12):
    for name in names if block % 2 == 0 else names[::-1]:
        start = time.perf_counter()
        for _ in range(16):
            if name in sequences:
                sequences[name].forward([token], 1)
            else:
                ll.eval([token])
        ms[name].append((time.perf_counter() - start) / 16 * 1000)
for name, values in ms.items():
    print(f"{name}: ms per one-token pass {[f'{x:.2f}' for x in values]}, median {statistics.median(values):.2f}")
