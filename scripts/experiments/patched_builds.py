"""The project's llama.cpp wheel built with only some of its patches, to see which one a pass cost comes from.

Each NAME=PREFIX builds llama-cpp-python (the pinned version, this CPU's flags: spekula.llamacpp_build) with the
patches in patches/llamacpp/ whose names sort up to PREFIX (`0005`: 0001-0005; `none`: the stock sdist), unpacked
into OUT/NAME, a folder to put first on PYTHONPATH (about five minutes a build on 2 cores):

    .venv/bin/python scripts/experiments/patched_builds.py /tmp/builds stock=none p0005=0005 p0007=0007
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 PYTHONPATH=/tmp/builds/p0005:src .venv/bin/python scripts/pass_costs.py \\
        --runtime llamacpp --context 300 --repeats 9 --widths 1,4 --no-exact qwen2.5-coder-1.5b

(the installed wheel, all patches, is .venv/lib/python3.11/site-packages). docs/BENCHMARKS.md, "Against llama-server,
cold and warm", has what it gave on an AMD EPYC Zen 4.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from spekula import llamacpp_build


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not all("=" in a for a in argv[1:]):
        raise SystemExit("usage: patched_builds.py OUT NAME=PREFIX [NAME=PREFIX ...]   (PREFIX: 0005, or none)")
    out = Path(argv[0])
    version = llamacpp_build.pinned_version()
    args = llamacpp_build.cmake_args(llamacpp_build.this_cpu_flags())
    for name, prefix in (a.split("=", 1) for a in argv[1:]):
        patches = tuple(p for p in llamacpp_build.patch_files() if prefix != "none" and p.name[:4] <= prefix)
        wheel = llamacpp_build.build_wheel(sys.executable, version, args, out / f"{name}-wheel", patches)
        zipfile.ZipFile(wheel).extractall(out / name)
        print(f"{name}: {', '.join(p.name for p in patches) or 'no patches'} -> {out / name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
