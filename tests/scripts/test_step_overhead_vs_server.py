"""scripts/experiments/step_overhead_vs_server.py: the pure parts that turn llama-server's answers, spekula's step
marks and the preloaded shim's records into passes, compute and the time between passes. The measurement itself
needs llama-server and the model; docs/decisions/0007-llama-server-ngram.md cites its figures."""

from __future__ import annotations

import pytest

from scriptkit import loaded

MS = 1_000_000  # nanoseconds


@pytest.fixture(scope="module")
def script():
    with loaded("experiments/step_overhead_vs_server.py") as module:
        yield module


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_width_one_is_plain_llama_server_and_wider_ones_draft_width_minus_one(script):
    plain = script.server_argv("llama-server", "m.gguf", 1, 2, 18181)
    assert "--spec-type" not in plain and option(plain, "--port") == "18181" and option(plain, "-t") == "2"
    wide = script.server_argv("llama-server", "m.gguf", 17, 2, 18181)
    assert option(wide, "--spec-type") == "ngram-simple" and option(wide, "--spec-ngram-simple-size-m") == "16"
    assert int(option(wide, "--spec-ngram-simple-size-n")) == min(script.NGRAM_N, 16)
    # ngram-simple drafts nothing shorter than its lookup n-gram, so n may not exceed the draft
    narrow = script.server_argv("llama-server", "m.gguf", 3, 2, 18181)
    assert option(narrow, "--spec-ngram-simple-size-n") == "2"
    assert script.server_argv("llama-server", "m.gguf", 1, 2, 1, extra="-fa on")[-2:] == ["-fa", "on"]


def test_metrics_keeps_unlabelled_series_by_name(script):
    text = (
        "# HELP llamacpp:spec_decode_num_drafts_total Speculative: ...\n"
        "# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
        "llamacpp:spec_decode_num_drafts_total 12\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7\n'
        "llamacpp:n_decode_total 40\n"
    )
    assert script.parse_metrics(text) == {"spec_decode_num_drafts_total": 12.0, "n_decode_total": 40.0}


def test_regions_are_read_back_and_a_record_cut_short_is_left_out(script):
    data = script.RECORD.pack(1, 5) + script.RECORD.pack(9, 30) + b"\x01\x02"
    assert script.parse_regions(data) == [(1, 5), (9, 30)]


def test_a_requests_passes_are_its_last_long_regions_inside_its_window(script):
    regions = [
        (0, 30 * MS),  # before the window: another request
        (100 * MS, 300 * MS),  # the prompt's pass
        (301 * MS, 301 * MS + 10),  # an operator of another library: not a pass
        (302 * MS, 330 * MS),
        (331 * MS, 360 * MS),
        (400 * MS, 430 * MS),  # after the window
    ]
    assert script.pass_regions(regions, 50 * MS, 370 * MS, 2, 2 * MS) == [(302 * MS, 330 * MS), (331 * MS, 360 * MS)]
    with pytest.raises(ValueError, match="3 regions"):
        script.pass_regions(regions, 50 * MS, 370 * MS, 4, 2 * MS)


def test_compute_gaps_and_llama_decode_around_the_compute_are_medians_in_ms(script):
    regions = [(0, 10 * MS), (11 * MS, 21 * MS), (24 * MS, 36 * MS)]  # compute 10, 10, 12; gaps 1, 3
    compute, gap, around = script.compute_and_gaps(regions)
    assert (compute, gap, around) == (pytest.approx(10.0), pytest.approx(2.0), None)
    _, _, around = script.compute_and_gaps(regions, (0.0105, 0.0102, 0.0124))  # 0.5, 0.2, 0.4 ms around
    assert around == pytest.approx(0.4)
    with pytest.raises(ValueError, match="2 llama_decode calls for 3 passes"):
        script.compute_and_gaps(regions, (0.01, 0.01))


def test_llama_servers_passes_are_its_tokens_after_the_first_less_the_accepted_drafts(script):
    timings = {"predicted_n": 33, "predicted_ms": 800.0, "draft_n": 28, "draft_n_accepted": 24}
    steps = script.server_steps(timings, drafts=7)
    assert (steps.passes, steps.tokens, steps.drafts, steps.rows) == (8, 32, 7, 36)
    assert steps.ms_per_pass == pytest.approx(100.0) and steps.mean_width == pytest.approx(4.5)
    plain = script.server_steps({"predicted_n": 11, "predicted_ms": 250.0}, drafts=0)
    assert (plain.passes, plain.rows, plain.ms_per_pass) == (10, 10, pytest.approx(25.0))


def test_spekulas_passes_run_from_its_first_emitting_step_to_its_last(script):
    # the prompt's step emitted 3 tokens, then 3 steps; the last mark (a text flush) emitted nothing
    marks = [(1.0, 3), (1.1, 8), (1.2, 13), (1.4, 14), (1.5, 14)]
    decodes = [(5, 0.09), (5, 0.09), (1, 0.03)]
    steps = script.loop_steps(marks, decodes)
    assert (steps.passes, steps.tokens, steps.drafts, steps.rows) == (3, 11, 2, 11)
    assert steps.seconds == pytest.approx(0.4) and steps.decode_s == (0.09, 0.09, 0.03)
    with pytest.raises(ValueError, match="3 passes after the first token and 2"):
        script.loop_steps(marks, decodes[:2])


def test_widths_are_checked_with_a_clear_error(script):
    assert script.parse_widths("1, 9,17") == [1, 9, 17]
    for bad in ("0", "1,x", "", "66"):
        with pytest.raises(Exception, match="widths must be"):
            script.parse_widths(bad)
