"""The llama.cpp build the project's own set-up makes: for this CPU's instruction sets, never -march=native,
never AMX, cached under a key of its options (spekula.llamacpp_build; docs/decisions/0001-llamacpp-build.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from spekula import llamacpp_build as build

ROOT = Path(__file__).resolve().parents[2]

# /proc/cpuinfo flags of the three kinds of machine this project has run on (trimmed to what matters)
SAPPHIRE_RAPIDS = (
    "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl "
    "avx512ifma avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
)
EPYC_AVX512 = (
    "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl "
    "avx512vbmi avx512_vnni avx512_bf16 avx_vnni"
)
SKYLAKE_X = (
    "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl"
)
EPYC_AVX2 = "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2"


def flags(line: str) -> frozenset[str]:
    return build.cpu_flags(f"processor\t: 0\nvendor_id\t: X\nflags\t\t: {line}\nbugs\t\t: spectre_v1\n")


def options(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("-D").split("=", 1) for a in args)


def test_cpuinfo_flags_are_read_from_the_flags_line():
    assert flags("sse4_2 avx2  amx_tile") == {"sse4_2", "avx2", "amx_tile"}
    assert build.cpu_flags("processor : 0\n") == frozenset()


@pytest.mark.parametrize("cpu", [SAPPHIRE_RAPIDS, EPYC_AVX512, EPYC_AVX2])
def test_no_build_is_native_and_none_compiles_amx(cpu):
    args = build.cmake_args(flags(cpu), machine="x86_64")
    opts = options(args)
    assert opts["GGML_NATIVE"] == "OFF"
    assert all(opts[f"GGML_{o}"] == "OFF" for o in ("AMX_TILE", "AMX_INT8", "AMX_BF16"))
    assert not any("march" in a for a in args)
    # every instruction-set option is explicit, so nothing falls back to ggml's defaults
    assert {f"GGML_{f.option}" for f in build.FEATURES} <= set(opts)


def test_an_amx_xeon_gets_its_avx512_family_and_no_amx():
    opts = options(build.cmake_args(flags(SAPPHIRE_RAPIDS), machine="x86_64"))
    on = {k for k, v in opts.items() if v == "ON"}
    assert {"GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"} <= on
    assert not any("AMX" in k for k in on)


def test_an_avx2_only_cpu_gets_no_avx512():
    opts = options(build.cmake_args(flags(EPYC_AVX2), machine="x86_64"))
    assert opts["GGML_AVX2"] == opts["GGML_FMA"] == opts["GGML_F16C"] == "ON"
    assert all(v == "OFF" for k, v in opts.items() if "AVX512" in k or "VNNI" in k)


def test_avx512_needs_all_five_subsets_its_compiler_flags_assume():
    missing_bw = EPYC_AVX512.replace("avx512bw ", "")
    opts = options(build.cmake_args(flags(missing_bw), machine="x86_64"))
    assert opts["GGML_AVX512"] == "OFF"


def test_off_x86_nothing_is_chosen_but_native_stays_off():
    assert build.cmake_args(flags(EPYC_AVX2), machine="aarch64") == ["-DGGML_NATIVE=OFF"]


def test_the_cache_key_tells_cpus_and_versions_apart():
    keys = {
        cpu: build.build_key("0.3.36", build.cmake_args(flags(cpu), machine="x86_64"), machine="x86_64")
        for cpu in (SAPPHIRE_RAPIDS, EPYC_AVX512, EPYC_AVX2, SKYLAKE_X)
    }
    assert len({keys[EPYC_AVX2], keys[EPYC_AVX512], keys[SKYLAKE_X]}) == 3
    assert keys[SAPPHIRE_RAPIDS] == keys[EPYC_AVX512]  # the same options (AMX is never one): the same wheel
    assert all(k.startswith("0.3.36-x86_64-") for k in keys.values())
    assert "avx512" not in keys[EPYC_AVX2] and "avx2" in keys[EPYC_AVX2]
    again = build.build_key("0.3.36", build.cmake_args(flags(EPYC_AVX2), machine="x86_64"), machine="x86_64")
    assert again == keys[EPYC_AVX2]
    other = build.build_key("0.3.37", build.cmake_args(flags(EPYC_AVX2), machine="x86_64"), machine="x86_64")
    assert other != again


def test_the_pinned_version_is_read_from_the_requirement_file(tmp_path):
    req = tmp_path / "llamacpp.txt"
    req.write_text("# a comment\nllama-cpp-python==9.8.7  # pinned\n")
    assert build.pinned_version(req) == "9.8.7"
    req.write_text("llama-cpp-python>=1\n")
    with pytest.raises(SystemExit, match="pins no"):
        build.pinned_version(req)


def test_the_set_up_builds_llama_cpp_through_the_keyed_build_and_never_through_pip_s_default():
    base = (ROOT / "requirements" / "base.txt").read_text()
    assert not re.search(r"^\s*llama-cpp-python", base, re.M), "pip would build it with -march=native"
    makefile = (ROOT / "Makefile").read_text()
    assert "src/spekula/llamacpp_build.py key" in makefile  # the stamp carries the CPU's key
    assert "-m spekula.llamacpp_build install" in makefile
    setup = re.search(r"^setup:(.*)$", makefile, re.M).group(1)
    assert "$(LLAMA_STAMP)" in setup
    demo_chain = re.search(r"^demo:(.*)$", makefile, re.M).group(1) + re.search(r"^models:(.*)$", makefile, re.M)[1]
    assert "llama-server" not in demo_chain
    pinned = build.pinned_version(ROOT / "requirements" / "llamacpp.txt")
    extra = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"llama-cpp-python>=([\d.]+),<', extra).group(1) == pinned


def test_the_key_command_runs_with_the_standard_library_alone():
    """The Makefile computes the key with the system Python, before any dependency is installed."""
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "src" / "spekula" / "llamacpp_build.py"), "key"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    expected = build.build_key(
        build.pinned_version(), build.cmake_args(build.this_cpu_flags()), patches=build.patch_files()
    )
    assert done.stdout.strip() == expected


def test_a_changed_patch_is_another_build(tmp_path):
    args = build.cmake_args(flags(EPYC_AVX2), machine="x86_64")
    patch = tmp_path / "0001-x.patch"
    patch.write_text("one\n")
    first = build.build_key("0.3.36", args, machine="x86_64", patches=(patch,))
    patch.write_text("two\n")
    second = build.build_key("0.3.36", args, machine="x86_64", patches=(patch,))
    unpatched = build.build_key("0.3.36", args, machine="x86_64")
    assert len({first, second, unpatched}) == 3
    assert {k.rsplit("-", 1)[0] for k in (first, second, unpatched)} == {unpatched.rsplit("-", 1)[0]}


def test_a_patch_is_applied_hunk_by_hunk_and_refused_where_the_source_differs(tmp_path):
    source = tmp_path / "src" / "k.c"
    source.parent.mkdir()
    source.write_text("a\nb\nc\nd\ne\nf\n")
    patch = tmp_path / "0001-k.patch"
    patch.write_text(
        "Why: a description before the first file is skipped.\n\n"
        "--- a/src/k.c\n+++ b/src/k.c\n"
        "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
        "@@ -5,2 +5,3 @@\n e\n+e2\n f\n"
        "\nA blank line and text after the last hunk are not part of it.\n"
    )
    build.apply_patch(patch, tmp_path)
    assert source.read_text() == "a\nB\nc\nd\ne\ne2\nf\n"
    with pytest.raises(SystemExit, match="does not apply to .*k.c at line 2: expected 'b'"):
        build.apply_patch(patch, tmp_path)  # already applied: line 2 is B now


def test_the_shipped_patches_apply_to_the_pinned_llama_cpp(tmp_path):
    """The sdist the build compiles (downloaded once into the cache by the set-up) takes every patch."""
    patches = build.patch_files()
    assert patches
    source = build._unpack(build._sdist(sys.executable, build.pinned_version()), tmp_path) / "vendor" / "llama.cpp"
    for patch in patches:
        text = patch.read_text()
        why = re.search(r"docs/decisions/\d{4}-[\w-]+\.md", text)  # the why comes first, in a decision record
        assert why and why.start() < text.index("--- a/"), patch.name
        assert (Path(__file__).resolve().parents[2] / why.group()).is_file(), why.group()
        names = re.findall(r"^\+\+\+ b/(\S+)", text, re.M)
        before = {n: (source / n).read_text() for n in names}
        build.apply_patch(patch, source)
        assert all((source / n).read_text() != before[n] for n in names), patch.name
