"""Kernel forms of the project's llama.cpp build that compute the same bits at different speeds, chosen at load by
measurement (docs/decisions/0021-q6_K-kernel-form-by-measurement.md).

Repacked Q6_K weights (patch 0006: Qwen2.5's output matrix, attn_v and half of ffn_down in a Q4_K_M GGUF) are scored
by a 512-bit form of the kernels (AVX-512 BW: a step's 8 columns in one vector) or a 256-bit one (AVX2: 4 at a time).
Both give every output the same bits (an output's integer sums over a super block are exact in any order, and both
forms take them into float with the same multiply-add), so the choice moves time only. Which is faster follows the
core, not the instruction sets (a Zen 4 runs a 512-bit operation as two 256-bit halves), so a build for AVX-512 BW
keeps both (patch 0009) and says by run of rows which one runs (RUNS). A load times a pass of each run's width in
either form, alternated, and sets the faster; the choice is recorded under the key of exact mode's attention way
(the library files, this CPU, the GGUF and the thread count), so a restart does not time it again, and
SPEKULA_MEASURE_WAYS=1 times it again. A build without the switch (another llama.cpp, or no AVX-512 BW) has no
choice: nothing is timed.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spekula import llamacpp_check
from spekula.models.cache import cache_dir, read_json, write_json

log = logging.getLogger(__name__)

SWITCH = "ggml_spekula_q6_K_zmm_runs"  # patch 0009: int (int runs), libggml-cpu's C linkage
# set to 1: time the forms again and measure exact mode's attention ways again (backends/llamacpp.py) rather than
# take what a load recorded
MEASURE_WAYS_ENV = "SPEKULA_MEASURE_WAYS"


@dataclass(frozen=True)
class Run:
    """A run of rows the switch sets apart: the bit that gives it the 512-bit form, and the pass width timed for it."""

    name: str
    bit: int
    width: int


# patch 0009's bits: the one-row gemv and the rows left alone, a group of four with those after it, groups of eight
RUNS = (Run("1-3 rows", 1, 1), Run("4-7 rows", 2, 4), Run("8 rows", 4, 8))
BUILT = 1 | 2 | 4  # every run in the 512-bit form: a build's setting before any choice
REPEATS = 5  # timed passes a form and run, alternated
MARGIN = 0.02  # the 256-bit form replaces the build's 512-bit one only where it is faster by more than this
CONTEXT = 64  # tokens before the timed passes (a verify pass's attention is a small share of its time either way)


def record_key(gguf: Path, threads: int) -> str | None:
    """The key of a choice measured at load for this GGUF on this build of llama.cpp (its library files), this CPU and
    this thread count; None where the package is not found."""
    package = llamacpp_check.package_dir()
    if package is None:
        return None
    stat, library = gguf.stat(), llamacpp_check.verdict_path(package).stem  # the library files and the CPU
    key = f"{library}\n{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n{threads}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def measure_again() -> bool:
    """SPEKULA_MEASURE_WAYS is set: what a load chose by measurement is measured again, not read from its record."""
    return os.environ.get(MEASURE_WAYS_ENV, "") not in ("", "0")


def switch() -> Callable[[int], int] | None:
    """patch 0009's ggml_spekula_q6_K_zmm_runs in the libggml-cpu this process runs, or None where there is none loaded
    or it has no 512-bit form to switch (no patch 0009, no AVX-512 BW, another platform)."""
    library = loaded_library("libggml-cpu")
    if library is None:
        return None
    try:
        function = getattr(ctypes.CDLL(library), SWITCH)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
    return function if function(-1) >= 0 else None


def loaded_library(stem: str, maps: Path = Path("/proc/self/maps")) -> str | None:
    """The path of the library file named stem* that this process has mapped, or None. dlopen of that very path gives
    the loaded copy; another path to the same library (the wheel ships lib/libggml-cpu.so as a copy of the
    libggml-cpu.so.0 that libllama loads) would load a second copy, whose switch no pass reads."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:  # no /proc: not Linux
        return None
    for line in lines:
        path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
        if Path(path).name.startswith(stem + ".so"):
            return path
    return None


def choose_runs(
    time_pass: Callable[[int, int], float], built: int, repeats: int = REPEATS, margin: float = MARGIN
) -> tuple[int, dict[str, tuple[float, float]]]:
    """The runs to give the 512-bit form, and what each run's choice saw (median seconds of a pass in the 512-bit
    form, in the 256-bit one). time_pass(width, runs) sets the switch to `runs` and times one pass of `width` rows.
    Each run of RUNS is timed at its width with its bit set and cleared, the others as built (a pass of that width
    takes no other run), alternated, the first order flipping each repeat; its bit stays as built unless the
    256-bit form is faster by more than `margin`."""
    runs, seen = built, {}
    for run in RUNS:
        if not built & run.bit:
            continue  # the build gives this run the 256-bit form already
        wide, narrow = built, built & ~run.bit
        time_pass(run.width, wide)  # a first pass of this width: its buffers and caches warm, not timed
        times: dict[int, list[float]] = {wide: [], narrow: []}
        for i in range(repeats):
            for setting in (wide, narrow) if i % 2 == 0 else (narrow, wide):
                times[setting].append(time_pass(run.width, setting))
        zmm, ymm = statistics.median(times[wide]), statistics.median(times[narrow])
        seen[run.name] = (zmm, ymm)
        if ymm < zmm * (1 - margin):
            runs &= ~run.bit
    return runs, seen


@dataclass(frozen=True)
class _Record:
    path: Path

    @classmethod
    def of(cls, gguf: Path, threads: int) -> _Record | None:
        key = record_key(gguf, threads)
        return None if key is None else cls(cache_dir() / "llamacpp-forms" / f"{key}.json")

    def read(self) -> int | None:
        data = None if measure_again() else read_json(self.path)
        runs = data.get("q6_K_zmm_runs") if isinstance(data, dict) else None
        return runs if isinstance(runs, int) and 0 <= runs <= 7 else None

    def write(self, runs: int, seen: dict[str, tuple[float, float]]) -> None:
        try:
            write_json(self.path, {"q6_K_zmm_runs": runs, "seconds_512_256": seen})
        except OSError as e:  # a read-only cache: every load times the forms
            log.warning(f"could not record the Q6_K kernel form in {self.path}: {e}")


def set_faster_q6_K_form(model: Any, gguf: Path, threads: int, vocab_size: int) -> int | None:
    """Give each run of rows the faster of the build's Q6_K kernel forms (recorded, or timed on a context of its own
    on `model`, a llama_cpp LlamaModel) and return the runs left to the 512-bit form; None where the build has no
    choice. Nothing to do with exactness: both forms compute the same bits. The switch is the process's: with two
    GGUFs loaded (a draft model's and the target's), the later load's choice holds for both."""
    set_runs = switch()
    if set_runs is None:
        return None
    record = _Record.of(gguf, threads)
    if record is not None and (recorded := record.read()) is not None:
        set_runs(recorded)
        log.info(f"repacked Q6_K: the 512-bit kernels for {_names(recorded)}, as recorded in {record.path}")
        return recorded
    try:  # from the build's setting (BUILT), not the switch's now: an earlier load in this process may have set it
        timer = _PassTimer(model, threads, vocab_size, set_runs)
        try:
            runs, seen = choose_runs(timer.time_pass, BUILT)
        finally:
            timer.close()
    except Exception:  # a choice of speed only: a failed timing must not fail the load
        log.warning("could not time the Q6_K kernel forms; the build's 512-bit form runs", exc_info=True)
        set_runs(BUILT)
        return BUILT
    set_runs(runs)
    log.info(
        f"repacked Q6_K: the 512-bit kernels for {_names(runs)} ("
        + ", ".join(f"{name}: {1000 * z:.1f} ms a pass, {1000 * y:.1f} in 256-bit" for name, (z, y) in seen.items())
        + ")"
    )
    if record is not None:
        record.write(runs, seen)
    return runs


def _names(runs: int) -> str:
    return ", ".join(run.name for run in RUNS if runs & run.bit) or "no run (256-bit throughout)"


class _PassTimer:
    """Passes of a few rows after CONTEXT tokens, on a context of their own, each one's rows then dropped."""

    def __init__(self, model: Any, threads: int, vocab_size: int, set_runs: Callable[[int], int]) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaBatch, LlamaContext

        width = CONTEXT + max(run.width for run in RUNS)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = width
        params.n_threads = params.n_threads_batch = threads
        self.ctx = LlamaContext(model=model, params=params, verbose=False)
        self.batch = LlamaBatch(n_tokens=width, embd=0, n_seq_max=1, verbose=False)
        self.set_runs = set_runs  # the switch the load found
        self.tokens = [(vocab_size // 3 + 7 * i) % vocab_size for i in range(width)]
        self.batch.set_batch(self.tokens[:CONTEXT], n_past=0, logits_all=False)
        self.ctx.decode(self.batch)

    def time_pass(self, width: int, runs: int) -> float:
        self.set_runs(runs)
        self.batch.set_batch(self.tokens[CONTEXT : CONTEXT + width], n_past=CONTEXT, logits_all=True)
        began = time.perf_counter()
        self.ctx.decode(self.batch)
        seconds = time.perf_counter() - began
        self.ctx.kv_cache_seq_rm(0, CONTEXT, -1)
        return seconds

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
