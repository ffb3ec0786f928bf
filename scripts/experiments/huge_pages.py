"""Does llama.cpp decode faster with its weights on 2 MiB pages? llama-cpp-python's passes over the same GGUF in
fresh processes, alternately without and with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (what `spekula` gives
itself: spekula.hugepages), ms per pass of S tokens after an 81-token prompt (median of 12 blocks for S = 1, 5
for wider), and how much of the process's anonymous memory sat on huge pages.

    .venv/bin/python scripts/experiments/huge_pages.py [PAIRS] [MODEL]   # ~20 s a process with the 1.5B

2026-12-01 (AVX-512 machine, Linux 6.18, THP "madvise"), Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, `huge_pages.py 5`
(4 KiB against 2 MiB pages): S=1 30.0/27.6, 29.6/27.4, 29.7/27.7, 28.1/26.4, 28.3/26.7 ms (6 to 8% faster in
every pair); S=4 64.4/70.2, 71.8/68.1, 74.9/68.9, 71.1/68.3, 71.3/68.2; S=16 120.1/137.2, 137.1/134.4,
139.0/133.6, 136.2/131.2, 135.1/132.6; 1.30 GB of huge pages with the tunable, none without.
"""

import os
import statistics
import subprocess
import sys
import time

WIDTHS = (1, 4, 16)


def child(model: str) -> None:
    from llama_cpp import Llama

    from spekula.models.cache import gguf_dir
    from spekula.models.catalogue import CATALOGUE

    gguf = str(gguf_dir() / CATALOGUE[model].gguf_file)
    llama = Llama(model_path=gguf, n_ctx=4096, n_threads=2, n_batch=512, n_ubatch=512, use_mmap=False, verbose=False)
    prompt = llama.tokenize(b"Write a long story about a lighthouse keeper. " * 8)
    llama.eval(prompt)
    context = llama.n_tokens
    cells = []
    for width in WIDTHS:
        passes = 8 if width == 1 else 2
        blocks = []
        for _ in range(12 if width == 1 else 5):
            start = time.perf_counter()
            for _ in range(passes):
                llama.n_tokens = context  # the next eval overwrites the same positions
                llama.eval(prompt[:width])
            blocks.append((time.perf_counter() - start) / passes * 1000)
        cells.append(f"S={width} {statistics.median(blocks):.1f} ms")
    with open("/proc/self/smaps_rollup") as f:
        huge = next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))
    print(", ".join(cells) + f", huge pages {huge / 1e6:.2f} GB", flush=True)


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    model = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b"
    plain = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    huge = {**plain, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    for pair in range(pairs):
        for label, env in (("4 KiB pages", plain), ("2 MiB pages", huge)):
            out = subprocess.run(
                [sys.executable, __file__, "--child", model], env=env, capture_output=True, text=True, check=True
            ).stdout.strip()
            print(f"pair {pair + 1}, {label}: {out}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main()
