"""The cost model: pass costs, expected tokens per pass, and the k that is fastest for one sequence or a batch."""

import pytest

from costkit import compute_bound, memory_bound

from spekula.config import SpecConfig
from spekula.cost import DRIFT, RECALIBRATE_GAP, CostModel, calibration_widths, expected_tokens
from spekula.engine import Engine
from spekula.proposers import DraftModelFactory
from spekula.testing import random_table_backend


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_interpolation_between_measured_widths():
    c = CostModel(target_s={1: 1.0, 5: 3.0})
    assert c.target_cost(3) == pytest.approx(2.0)
    assert c.target_cost(9) == pytest.approx(5.0)  # extrapolated with the last slope


def test_memory_bound_target_drafts_long_when_acceptance_is_high():
    assert memory_bound().best_k(alpha=0.6, k_max=8)[0] in (1, 2)
    k, speedup = memory_bound().best_k(alpha=0.95, k_max=8)
    assert k >= 3 and speedup > 1.5


def test_batched_passes_switch_speculation_off_as_the_batch_grows():
    # Packed fp32 weights on a CPU: flat up to ~16 rows, then compute-bound (linear in rows).
    target_s = {1: 0.65, 9: 0.80, 16: 0.95, 32: 1.9, 64: 3.8, 144: 8.6}
    c = CostModel(target_s=target_s, draft_s_per_token=0.04, frozen=True)
    alone, speedup_alone = c.best_batch_k([0.75], k_max=8)
    assert (alone, speedup_alone) == c.best_k(0.75, k_max=8) and alone >= 3 and speedup_alone > 1.5
    k16, speedup16 = c.best_batch_k([0.75] * 16, k_max=8)
    assert k16 == 0 and speedup16 == 1.0  # 16 plain rows cost 0.95 s: per token, plain is already cheap
    k4, _ = c.best_batch_k([0.75] * 4, k_max=8)
    assert 0 < k4 < alone  # in between: shorter drafts
    assert c.best_batch_k([0.0] * 4, k_max=8)[0] == 0


def test_compute_bound_target_with_a_costly_draft_decodes_plainly():
    k, speedup = compute_bound().best_k(alpha=0.75, k_max=8)
    assert k == 0 and speedup == 1.0


def test_low_acceptance_means_plain_decoding():
    assert memory_bound().best_k(alpha=0.05, k_max=8)[0] == 0


def test_free_draft_on_compute_bound_target_still_pays_when_acceptance_is_high():
    c = compute_bound()
    c.draft_s_per_token = 0.0  # n-gram lookup
    k, speedup = c.best_k(alpha=0.9, k_max=8)
    assert k >= 1 and speedup > 1.0


def test_online_observations_refine_the_costs():
    c = CostModel(target_s={1: 1.0})
    c.observe_target(1, 2.0)
    c.observe_target(3, 0.5)
    assert 1.0 < c.target_s[1] < 2.0 and c.target_s[3] == 0.5


def test_calibration_measures_every_width():
    target = random_table_backend(20, seed=0)
    engine = Engine(target, DraftModelFactory(random_table_backend(20, seed=1)), SpecConfig(k=None, k_max=3))
    engine.calibrate()
    assert sorted(engine.costs.target_s) == [1, 2, 3, 4]
    assert engine.costs.draft_s_per_token > 0


def test_calibration_times_the_widths_where_grouped_row_kernels_change_slope():
    # llama.cpp's repacked kernels work in groups of 4 rows: 16 rows cost far less than 17, so both are timed
    assert calibration_widths(3) == [1, 2, 3, 4]
    assert calibration_widths(16) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17]
    assert calibration_widths(18) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 19]  # k_max + 1 itself, always
    assert calibration_widths(16, every=True) == list(range(1, 18))
    costs = CostModel()
    costs.calibrate(random_table_backend(20, seed=0), k_max=16, max_rows=4 * 17, every_width_s=0.0)
    assert sorted(costs.target_s) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 32, 64, 68]  # a server: 4 x 17 rows
    # where the dense widths say every width past them costs little to time, every one is timed
    costs = CostModel()
    costs.calibrate(random_table_backend(20, seed=0), k_max=16, every_width_s=60.0)
    assert sorted(costs.target_s) == list(range(1, 18))


def test_best_k_follows_a_cost_curve_that_is_not_monotonic():
    # llama.cpp Q4 on 2 cores (issue 14): a 16-row pass is cheaper than a 12-row one and half a 17-row one
    ms = {1: 77, 2: 118, 4: 213, 8: 342, 9: 465, 12: 487, 16: 439, 17: 785}
    c = CostModel(target_s={n: v / 1000 for n, v in ms.items()}, frozen=True)
    assert c.target_cost(16) < c.target_cost(12) and c.target_cost(16) < c.target_cost(17)
    k, speedup = c.best_k(0.95, k_max=16)
    assert k == 15 and speedup == pytest.approx(c.tokens_per_s(0.95, 15) / c.tokens_per_s(0.95, 0))
    # a table that never timed 16 rows interpolates them between 12 and 17 and hides the cheap width
    hidden = CostModel(target_s={n: v / 1000 for n, v in ms.items() if n != 16}, frozen=True)
    assert hidden.best_k(0.95, k_max=16)[0] == 7 and hidden.best_k(0.95, k_max=16)[1] < speedup


def test_widths_not_observed_since_calibration_follow_the_drift_of_the_one_token_pass():
    # calibrated while the machine was busy: every pass measured twice as slow as it runs now
    c = CostModel()
    c.target_s = {1: 0.2, 2: 0.22, 9: 0.4}
    c.calibrated = dict(c.target_s)
    c._calibrated_at = 0
    for _ in range(30):
        c.observe_target(1, 0.1)  # plain decoding observes only one-token passes
    assert c.drift == pytest.approx(0.5, rel=0.01)
    assert c.target_cost(9) == pytest.approx(0.2, rel=0.01) and c.target_cost(5) == pytest.approx(0.15, rel=0.01)
    c.observe_target(9, 0.25)  # a width observed online is its own measurement from then on
    assert c.target_cost(9) == pytest.approx(0.8 * 0.2 + 0.2 * 0.25, rel=0.01)
    # and the table asks to be measured again, once enough steps have passed since the last time
    assert not c.stale()
    for _ in range(RECALIBRATE_GAP):
        c.tick()
    assert c.stale()


def test_a_stale_table_is_measured_again_before_the_next_request():
    target = random_table_backend(20, seed=0)
    engine = Engine(target, DraftModelFactory(random_table_backend(20, seed=1)), SpecConfig(k=None, k_max=3))
    engine.calibrate()
    costs = engine.costs
    measured = dict(costs.calibrated)
    for _ in range(10):
        costs.observe_target(1, 50 * measured[1])  # the machine got far slower (or calibration ran busy)
    for _ in range(RECALIBRATE_GAP):
        costs.tick()
    assert costs.stale() and costs.drift > 1 + DRIFT
    engine.new_controller()
    assert not costs.stale() and costs.drift == 1.0  # measured again: the online width counts from the new table
    assert costs.target_s[1] < 10 * measured[1]
    # a drift that measuring again does not remove waits twice as long before the next re-measurement
    for _ in range(10):
        costs.observe_target(1, 50 * measured[1])
    for _ in range(RECALIBRATE_GAP):
        costs.tick()
    assert not costs.stale()
    for _ in range(RECALIBRATE_GAP):
        costs.tick()
    assert costs.stale()


def test_expected_tokens_by_draft_position():
    # the last rate holds for later positions
    assert expected_tokens([0.5, 1.0], 3) == pytest.approx(1 + 0.5 + 0.5 + 0.5)
    assert expected_tokens([0.6] * 4, 6) == pytest.approx(expected_tokens(0.6, 6))


def test_one_sequence_is_a_batch_of_one():
    c = memory_bound()
    for alpha in (0.0, 0.3, 0.6, 0.95, 1.0, [0.9, 0.5, 0.7, 0.8], [0.2, 0.95]):
        assert c.best_k(alpha, k_max=8) == c.best_batch_k([alpha], k_max=8)
    # and its rate is tokens_per_s, maximised
    k, speedup = c.best_k(0.8, k_max=8)
    assert speedup == pytest.approx(c.tokens_per_s(0.8, k) / c.tokens_per_s(0.8, 0))
    assert all(c.tokens_per_s(0.8, k) >= c.tokens_per_s(0.8, j) for j in range(9))


def test_ties_go_to_the_longer_draft():
    flat = CostModel(target_s={1: 1.0, 9: 1.0}, frozen=True)  # every width costs one plain pass, drafts are free
    assert flat.best_k(0.0, k_max=8) == (8, 1.0)  # nothing is ever accepted: every k is worth plain decoding


def test_a_batch_sums_what_each_sequence_is_expected_to_emit():
    c = CostModel(target_s={1: 1.0, 2: 1.0, 4: 1.0, 8: 2.0}, frozen=True)
    # two sequences, one that always accepts and one that never does: k = 1 emits 2 + 1 tokens in one
    # 4-row pass, plain decoding 2 tokens in a 2-row pass of the same cost
    k, speedup = c.best_batch_k([1.0, 0.0], k_max=1)
    assert (k, speedup) == (1, pytest.approx(1.5))
    # per-position rates count the same way as a flat rate of the same value
    assert c.best_batch_k([[1.0], [0.0, 0.0]], k_max=3) == c.best_batch_k([1.0, 0.0], k_max=3)
