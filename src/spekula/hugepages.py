"""Model memory on 2 MiB pages: the `spekula` program restarts itself once with glibc's huge-page tunable.

A decoding pass streams every weight once (about 1 GB for a 1.5B Q4_K_M), so on 4 KiB pages it also walks
about 300,000 page-table entries; on transparent huge pages (THP) it walks 512 times fewer. llama.cpp's
one-token pass is faster on huge pages, and two models in one process then run their passes at the same
speed whichever was loaded first, where on 4 KiB pages the one loaded later ran faster and skewed in-process
comparisons: docs/decisions/0002-huge-pages.md has the measurements (scripts/experiments/huge_pages.py,
scripts/experiments/context_cost.py) and the machine.

Where THP is "always", every large allocation already gets huge pages; where it is "madvise" (Ubuntu's and
this machine's default), memory gets them only when asked with madvise(MADV_HUGEPAGE). llama.cpp does not
ask, and the allocation happens inside it, so the one process-wide switch is glibc's tunable
`glibc.malloc.hugetlb=1` (glibc 2.35+), which makes malloc ask for every block it maps. glibc reads
tunables only when a process starts, so `spekula` (the CLI, not the library) re-executes itself once, in
place (same process id, same arguments and interpreter options), with the tunable added to GLIBC_TUNABLES.
MADV_COLLAPSE could turn pages huge after loading instead, but kernels without it answer EINVAL (the
measuring machine's did: docs/decisions/0002-huge-pages.md), and copying the weights through fresh pages costs
seconds at every load.

Opt out with SPEKULA_HUGE_PAGES=0. A GLIBC_TUNABLES that already names glibc.malloc.hugetlb is left as it
is (the user's choice wins). Nothing happens off Linux, off glibc, or where THP is "never".
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "SPEKULA_HUGE_PAGES"  # "0": keep 4 KiB pages
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb


def thp_mode(text: str | None = None) -> str | None:
    """The kernel's THP mode ("always", "madvise" or "never"): the bracketed word of
    /sys/kernel/mm/transparent_hugepage/enabled; None where the file is absent or unreadable."""
    if text is None:
        try:
            text = THP_ENABLED.read_text()
        except OSError:
            return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def glibc_version() -> tuple[int, ...] | None:
    """(major, minor) of the C library this interpreter runs on, or None when it is not glibc."""
    name, version = platform.libc_ver()
    if name != "glibc":
        return None
    try:
        return tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return None


def huge_page_environ(
    environ: Mapping[str, str], mode: str | None, glibc: tuple[int, ...] | None, system: str
) -> dict[str, str] | None:
    """The environment to re-execute with so malloc backs large blocks with huge pages; None when a
    restart would gain nothing (THP already "always", or "never", or no such tunable) or is refused."""
    if system != "Linux" or mode != "madvise" or glibc is None or glibc < MIN_GLIBC:
        return None
    if environ.get(OPT_OUT, "1") == "0":
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == TUNABLE for item in tunables.split(":") if item):
        return None  # set already: by our own restart, or by the user
    env = dict(environ)
    env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1"
    return env


def reexec_with_huge_pages() -> None:
    """Replace this process with itself, huge pages asked for (see the module docstring); returns only
    when no restart is needed or possible. Call it first thing in a program's entry point, before any
    thread or model exists: exec keeps the process id and open files, and loses everything else."""
    env = huge_page_environ(os.environ, thp_mode(), glibc_version(), platform.system())
    if env is None or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError:
        return  # could not restart (an unusual interpreter path): run on 4 KiB pages
