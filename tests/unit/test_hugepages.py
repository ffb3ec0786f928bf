"""The `spekula` program's restart onto huge pages (spekula.hugepages): when it restarts, with what, and that
the restarted process really gets 2 MiB pages for a large block."""

import os
import subprocess
import sys
import textwrap

import pytest

from spekula.hugepages import OPT_OUT, glibc_version, huge_page_environ, thp_mode

GLIBC = (2, 36)


def test_the_thp_mode_is_the_bracketed_word():
    assert thp_mode("always [madvise] never\n") == "madvise"
    assert thp_mode("[always] madvise never") == "always"
    assert thp_mode("always madvise [never]") == "never"
    assert thp_mode("") is None


def test_a_madvise_kernel_restarts_with_the_tunable_added_to_what_is_there():
    env = huge_page_environ({"PATH": "/bin"}, "madvise", GLIBC, "Linux")
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    env = huge_page_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC, "Linux")
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize(
    "environ, mode, glibc, system",
    [
        ({}, "always", GLIBC, "Linux"),  # every large block is huge already
        ({}, "never", GLIBC, "Linux"),  # nothing to gain
        ({}, None, GLIBC, "Linux"),  # no THP in this kernel
        ({}, "madvise", None, "Linux"),  # musl: no such tunable
        ({}, "madvise", (2, 34), "Linux"),  # glibc before the tunable
        ({}, "madvise", GLIBC, "Darwin"),
        ({OPT_OUT: "0"}, "madvise", GLIBC, "Linux"),  # the user's opt-out
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise", GLIBC, "Linux"),  # the restarted process
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC, "Linux"),  # the user's own value wins
    ],
)
def test_no_restart_where_it_gains_nothing_or_is_refused(environ, mode, glibc, system):
    assert huge_page_environ(environ, mode, glibc, system) is None


PROGRAM = textwrap.dedent(
    """
    import os, sys
    from spekula.hugepages import reexec_with_huge_pages
    print("start", os.getpid(), flush=True)
    reexec_with_huge_pages()
    block = bytearray(64 << 20)  # malloc maps it; with the tunable, madvise(MADV_HUGEPAGE) too
    for i in range(0, len(block), 4096):
        block[i] = 1
    huge = next(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:"))
    print("tunables", os.environ.get("GLIBC_TUNABLES"), "huge_kib", huge, "argv", sys.argv[1:])
    """
)


@pytest.mark.skipif(
    thp_mode() != "madvise" or glibc_version() is None or glibc_version() < (2, 35),
    reason="the restart applies to Linux with glibc 2.35+ and THP in madvise mode only",
)
def test_the_restarted_process_is_the_same_process_with_its_arguments_and_huge_pages():
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_OUT)}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, "serve", "--port", "1"], env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    starts = [line for line in out if line.startswith("start")]
    assert len(starts) == 2 and starts[0] == starts[1]  # ran twice, under one process id
    words = next(line for line in out if line.startswith("tunables")).split()
    assert words[1] == "glibc.malloc.hugetlb=1"
    assert int(words[3]) >= 32 << 10  # at least half the 64 MiB block sits on huge pages
    assert "['serve', '--port', '1']" in " ".join(words[4:])
    opted_out = subprocess.run(
        [sys.executable, "-c", PROGRAM], env={**env, OPT_OUT: "0"}, capture_output=True, text=True, check=True
    ).stdout
    assert opted_out.count("start") == 1 and "tunables None huge_kib 0" in opted_out
