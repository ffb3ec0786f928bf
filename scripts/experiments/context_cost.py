"""A one-token llama_decode in spekula's plain llama.cpp context against llama-cpp-python's `Llama.eval`, same GGUF
(Qwen2.5-Coder-1.5B Q4_K_M), same process, same context size and threads, alternating blocks of 16 passes as the
context grows: is spekula's pass dearer than llama-cpp-python's, and is it the configuration or the process?

    .venv/bin/python scripts/experiments/context_cost.py [reference-first | throwaway-first]   # about a minute

throwaway-first loads (and frees) a llama-cpp-python model before spekula's and the reference.

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
"""

import statistics
import sys
import time

from llama_cpp import Llama

from spekula.config import BackendConfig
from spekula.models.cache import gguf_dir
from spekula.models.catalogue import CATALOGUE
from spekula.pipeline import load_model

MODEL = "qwen2.5-coder-1.5b"
gguf = str(gguf_dir() / CATALOGUE[MODEL].gguf_file)


def reference() -> Llama:
    return Llama(
        model_path=gguf, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2, use_mmap=False,
        verbose=False,
    )  # fmt: skip


if sys.argv[1:] == ["throwaway-first"]:
    throwaway = reference()
    del throwaway
    backend, codec = load_model(MODEL, BackendConfig(runtime="llamacpp", threads=2, context_length=4096))
    ll = reference()
elif sys.argv[1:] == ["reference-first"]:
    ll = reference()
    backend, codec = load_model(MODEL, BackendConfig(runtime="llamacpp", threads=2, context_length=4096))
else:
    backend, codec = load_model(MODEL, BackendConfig(runtime="llamacpp", threads=2, context_length=4096))
    ll = reference()
prompt = codec.encode("Write a long story about a lighthouse keeper. " * 8)
seq = backend.new_sequence()
seq.forward(prompt, 1)
ll.reset()
ll.eval(prompt)
token = codec.encode(" the")[0]
ms: dict[str, list[float]] = {"spekula": [], "llama-cpp-python": []}
for block in range(12):
    for name in ("spekula", "llama-cpp-python") if block % 2 == 0 else ("llama-cpp-python", "spekula"):
        start = time.perf_counter()
        for _ in range(16):
            if name == "spekula":
                seq.forward([token], 1)
            else:
                ll.eval([token])
        ms[name].append((time.perf_counter() - start) / 16 * 1000)
for name, values in ms.items():
    print(f"{name}: ms per one-token pass {['%.2f' % x for x in values]}, median {statistics.median(values):.2f}")
