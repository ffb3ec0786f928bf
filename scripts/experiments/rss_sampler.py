"""Does measuring peak memory slow the request it measures? llama-cpp-python's one-token passes over the same GGUF
(Qwen2.5-Coder-1.5B Q4_K_M, 2 threads) in one process, in alternating blocks of 32 passes: with nothing running
beside them, with `spekula bench`'s old sampler (a thread reading the RSS through psutil every 10 ms:
PeakRss(kernel=False)), and with what bench uses now on Linux (the kernel's high-water mark, reset by writing to
/proc/self/clear_refs: PeakRss(), no thread). Median ms per pass.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/rss_sampler.py [BLOCKS]   # ~1 min

On 2 cores llama.cpp's two threads fill the machine, so a third thread that wakes up takes a core from one of
them, and every op waits for the slower thread at its barrier.

2026-12-02 (AVX-512 machine), four processes, `rss_sampler.py` twice and `rss_sampler.py 48` twice, nothing /
sampler / kernel: 31.80 / 31.67 / 31.99, 33.16 / 34.80 / 33.92, 29.98 / 31.37 / 30.77, 32.70 / 33.55 / 32.16 ms.
So the sampler's passes were -0.4%, +4.9%, +4.6% and +2.6% against nothing beside them; the kernel's -1.7% to
+2.6%, which is this host's noise (nothing runs beside those passes). A throwaway first version the day before
(nothing against the sampler, two processes) had the sampler 4.5% and 1.3% slower.
"""

import statistics
import sys
import time

from llama_cpp import Llama

from spekula.bench.runner import PeakRss
from spekula.models.cache import gguf_dir
from spekula.models.catalogue import CATALOGUE

BLOCKS = int(sys.argv[1]) if len(sys.argv) > 1 else 24
MODES = ("nothing", "sampler", "kernel")

gguf = str(gguf_dir() / CATALOGUE["qwen2.5-coder-1.5b"].gguf_file)
llama = Llama(model_path=gguf, n_ctx=1024, n_threads=2, n_batch=64, use_mmap=False, verbose=False)
prompt = llama.tokenize(b"def fibonacci(n):\n    ")
times: dict[str, list[float]] = {mode: [] for mode in MODES}
for block in range(BLOCKS):
    mode = MODES[(block + block // len(MODES)) % len(MODES)]  # each mode in turn, the order rotating
    llama.reset()
    llama.eval(prompt)
    rss = None if mode == "nothing" else PeakRss(kernel=mode == "kernel")
    if rss is not None:
        rss.__enter__()
        rss.reset()
    for _ in range(32):
        start = time.perf_counter()
        llama.eval([prompt[-1]])
        times[mode].append(time.perf_counter() - start)
    if rss is not None:
        rss.peak()
        rss.__exit__()
for mode, values in times.items():
    print(f"{mode:8s} {statistics.median(values) * 1e3:7.2f} ms  ({len(values)} passes)")
