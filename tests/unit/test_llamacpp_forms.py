"""The choice between the build's Q6_K kernel forms at load (backends/llamacpp_forms.py), on made-up timings: which runs
of rows keep the 512-bit form, what is timed, and that a choice is recorded and read back. That both forms give the
same bits is checked on the real build (tests/integration/test_llamacpp_real.py)."""

from __future__ import annotations

import pytest

from spekula.backends import llamacpp_forms
from spekula.backends.llamacpp_forms import RUNS, choose_runs
from spekula.models.cache import read_json

ALL = llamacpp_forms.BUILT  # every run in the 512-bit form: what an AVX-512 BW build does before any choice


def timer(ymm_over_zmm: dict[int, float], calls: list[tuple[int, int]] | None = None):
    """A pass of `width` rows: 10 ms a row in the 512-bit form, times ymm_over_zmm[width] in the 256-bit one."""

    def time_pass(width: int, runs: int) -> float:
        if calls is not None:
            calls.append((width, runs))
        (run,) = [r for r in RUNS if r.width == width]
        return 0.01 * width * (1.0 if runs & run.bit else ymm_over_zmm[width])

    return time_pass


def test_a_run_takes_the_256_bit_form_only_where_it_is_faster_by_more_than_the_margin():
    # a Zen 4's pattern: the 256-bit form faster for a lone row, alike within the margin for 4, slower for 8
    runs, seen = choose_runs(timer({1: 0.88, 4: 0.99, 8: 1.16}), ALL)
    assert runs == ALL & ~1
    assert set(seen) == {run.name for run in RUNS}
    assert seen["1-3 rows"] == pytest.approx((0.01, 0.0088))
    assert seen["8 rows"] == pytest.approx((0.08, 0.0928))
    runs, _ = choose_runs(timer({1: 0.5, 4: 0.5, 8: 0.5}), ALL)
    assert runs == 0  # the 256-bit form throughout


def test_only_runs_the_build_gives_the_512_bit_form_are_timed_alternated():
    calls: list[tuple[int, int]] = []
    assert choose_runs(timer({1: 0.5, 4: 0.5, 8: 0.5}, calls), 0) == (0, {})
    assert calls == []  # nothing to choose
    runs, seen = choose_runs(timer({1: 0.5, 4: 0.5, 8: 1.2}, calls), 4, repeats=3)
    assert runs == 4 and list(seen) == ["8 rows"]
    # one untimed pass, then both settings each repeat, which goes first flipping
    assert calls == [(8, 4), (8, 4), (8, 0), (8, 0), (8, 4), (8, 4), (8, 0)]


class FakeSwitch:
    """patch 0009's ggml_spekula_q6_K_zmm_runs: set and report the runs"""

    def __init__(self, runs: int) -> None:
        self.runs = runs

    def __call__(self, runs: int) -> int:
        before = self.runs
        if runs >= 0:
            self.runs = runs
        return before


def test_the_load_records_its_choice_and_a_restart_takes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEKULA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(llamacpp_forms.MEASURE_WAYS_ENV, raising=False)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    made: list[int] = []

    class FakeTimer:
        def __init__(self, model, threads, vocab_size, set_runs):
            made.append(threads)
            self.time_pass = timer({1: 0.8, 4: 0.8, 8: 1.2})

        def close(self):
            pass

    library = FakeSwitch(ALL)
    monkeypatch.setattr(llamacpp_forms, "switch", lambda: library)
    monkeypatch.setattr(llamacpp_forms, "_PassTimer", FakeTimer)
    assert llamacpp_forms.set_faster_q6_K_form(None, gguf, 2, 100) == 4
    assert library.runs == 4 and made == [2]  # timed once, the library set
    library.runs = ALL  # a restart: the library as built again
    assert llamacpp_forms.set_faster_q6_K_form(None, gguf, 2, 100) == 4
    assert library.runs == 4 and made == [2]  # read from the record, not timed
    # another thread count, the switch left at this process's earlier choice: every run timed again all the same
    assert llamacpp_forms.set_faster_q6_K_form(None, gguf, 1, 100) == 4 and made == [2, 1]
    record = llamacpp_forms._Record.of(gguf, 1)
    assert record is not None and set(read_json(record.path)["seconds_512_256"]) == {run.name for run in RUNS}
    monkeypatch.setenv(llamacpp_forms.MEASURE_WAYS_ENV, "1")
    library.runs = ALL
    assert llamacpp_forms.set_faster_q6_K_form(None, gguf, 2, 100) == 4 and made == [2, 1, 2]  # timed again


def test_a_build_without_the_switch_times_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp_forms, "switch", lambda: None)
    monkeypatch.setattr(llamacpp_forms, "_PassTimer", None)  # would fail if made
    assert llamacpp_forms.set_faster_q6_K_form(None, tmp_path / "absent.gguf", 2, 100) is None


def test_the_switch_is_looked_up_in_the_library_file_the_process_mapped(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 fe:00 11 /usr/lib/libc.so.6\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 r-xp 00000000 fe:00 12 /venv/llama_cpp/lib/libggml-cpu.so.0\n"
    )
    assert llamacpp_forms.loaded_library("libggml-cpu", maps) == "/venv/llama_cpp/lib/libggml-cpu.so.0"
    assert llamacpp_forms.loaded_library("libggml-base", maps) is None
    assert llamacpp_forms.loaded_library("libggml-cpu", tmp_path / "absent") is None


def test_a_timing_that_fails_leaves_the_build_s_setting_and_the_load_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPEKULA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(llamacpp_forms.MEASURE_WAYS_ENV, raising=False)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")

    class FailingTimer:
        def __init__(self, model, threads, vocab_size, set_runs):
            raise RuntimeError("no memory for a context")

    library = FakeSwitch(0)  # an earlier load in the process chose the 256-bit form throughout
    monkeypatch.setattr(llamacpp_forms, "switch", lambda: library)
    monkeypatch.setattr(llamacpp_forms, "_PassTimer", FailingTimer)
    assert llamacpp_forms.set_faster_q6_K_form(None, gguf, 2, 100) == ALL
    assert library.runs == ALL and "could not time" in caplog.text
    record = llamacpp_forms._Record.of(gguf, 2)
    assert record is not None and not record.path.exists()  # nothing recorded: the next load times again
