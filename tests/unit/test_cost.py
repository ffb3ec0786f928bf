"""The cost model: pass costs, expected tokens per pass, and the k that is fastest for one sequence or a batch."""

import logging
import random
from collections.abc import Sequence

import pytest

from spekula.config import SpecConfig
from spekula.cost import DRIFT, RECALIBRATE_GAP, CostModel, calibration_widths, expected_tokens
from spekula.engine import Engine
from spekula.proposers import DraftModelFactory
from spekula.testing import random_table_backend

from costkit import compute_bound, memory_bound


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
    (alone,), speedup_alone = c.best_ks([(0.75, 8)])
    assert (alone, speedup_alone) == c.best_k(0.75, k_max=8) and alone >= 3 and speedup_alone > 1.5
    k16, speedup16 = c.best_ks([(0.75, 8)] * 16)
    assert k16 == [0] * 16 and speedup16 == 1.0  # 16 plain rows cost 0.95 s: per token, plain is already cheap
    k4, speedup4 = c.best_ks([(0.75, 8)] * 4)
    assert 0 < sum(k4) < 4 * alone and 1.0 < speedup4 < speedup_alone  # in between: fewer drafted rows
    assert c.best_ks([(0.0, 8)] * 4)[0] == [0] * 4


def test_in_a_batch_each_request_drafts_what_its_own_acceptance_pays_for():
    """llama.cpp's cost curve on 2 cores (compute-bound, cheapest per row in groups of 4): beside a
    request whose drafts always fail, one that is copying drafts long, and the other stays plain;
    with one k for both, the failing one would have paid for rows that emit nothing."""
    c = CostModel(target_s={1: 0.052, 2: 0.09, 4: 0.12, 8: 0.34, 12: 0.37, 16: 0.39, 17: 0.55, 32: 0.8}, frozen=True)
    ks, speedup = c.best_ks([(1.0, 15), (0.0, 15)])
    assert ks[1] == 0 and ks[0] >= 3 and speedup > 1.5
    assert c.best_ks([]) == ([], 1.0)  # an empty round
    # a request with nothing to draft (None) drafts nothing; one whose cap is 2 (slow start, or 3 tokens
    # left) drafts at most 2
    ks, _ = c.best_ks([None, (1.0, 2), (0.9, 15)])
    assert ks[0] == 0 and ks[1] <= 2

    def rate(outlooks, ks):
        tokens = sum(1.0 if o is None else expected_tokens(o[0], k) for o, k in zip(outlooks, ks, strict=True))
        return tokens / c.target_cost(sum(ks) + len(ks))

    # the best of every combination, on mixed batches of three
    for outlooks in (
        [(0.9, 15), (0.5, 15), (0.2, 15)],
        [(0.99, 15), (0.99, 15), (0.0, 15)],
        [None, (0.8, 7), ([0.95, 0.9, 0.9, 0.85], 15)],
    ):
        ks, speedup = c.best_ks(outlooks)
        assert speedup == pytest.approx(rate(outlooks, ks) / rate(outlooks, [0, 0, 0]))
        caps = [0 if o is None else o[1] for o in outlooks]
        best = max(
            rate(outlooks, [a, b, d])
            for a in range(caps[0] + 1)
            for b in range(caps[1] + 1)
            for d in range(caps[2] + 1)
        )
        assert rate(outlooks, ks) == pytest.approx(best), (outlooks, ks)


def test_a_lone_sequence_gets_the_answer_of_the_batch_search_bit_for_bit():
    """best_ks answers a batch of one with a plain loop (a lone request asks at every step); it must give
    what the general greedy search gives for it, exactly, on any rates and cost curve."""
    gen = random.Random(7)
    for trial in range(300):
        widths = sorted(gen.sample(range(1, 20), gen.randint(1, 8)))
        c = CostModel(target_s={w: gen.uniform(0.01, 0.3) for w in widths})
        c.draft_s_per_token = gen.choice([0.0, gen.uniform(0.0, 0.05)])
        alpha = gen.random() if trial % 2 else [gen.random() for _ in range(gen.randint(1, 16))]
        outlook = None if trial % 17 == 0 else (alpha, gen.randint(0, 16))
        assert c.best_ks([outlook]) == c._best_ks_greedy([outlook]), (outlook, c.target_s)


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


def test_a_width_observed_while_the_machine_was_slow_follows_the_one_token_pass_once_it_is_fast_again():
    # llama.cpp on 2 cores (AVX-512 host): the host ran twice as slow for a while, and drafts of 3 observed 4-row
    # passes then; since, plain steps observe the one-token pass back at its calibrated time
    ms = {1: 28.5, 2: 51.6, 3: 66.2, 4: 78.6, 5: 106, 8: 143.5, 9: 141.4, 12: 164.7, 13: 180.2, 16: 148.4, 17: 203.2}
    c = CostModel()
    c.target_s = {n: v / 1000 for n, v in ms.items()}
    c.calibrated = dict(c.target_s)
    c._calibrated_at = 0
    for step in range(30):
        c.observe_target(1, 2 * 0.0285)
        if step % 10 == 9:
            c.observe_target(4, 2 * 0.0786)
    assert c.drift == pytest.approx(2.0, rel=0.01) and c.target_cost(4) == pytest.approx(2 * 0.0786, rel=0.05)
    for _ in range(40):
        c.observe_target(1, 0.0285)
    assert c.drift == pytest.approx(1.0, rel=0.01)
    # the 4-row pass is as dear as the one-token pass says, not as dear as it was when observed
    assert c.target_cost(4) == pytest.approx(0.0786, rel=0.02) and c.target_cost(3) == pytest.approx(0.0662, rel=0.02)
    assert c.best_k([0.9] * 4, 4)[0] == 3  # with the 4-row pass at twice its cost, k = 2 (3 rows) won
    c.observe_target(4, 0.0786 * 1.5)  # observed again: its own measurement, blended from where the drift put it
    assert c.target_cost(4) == pytest.approx(0.0786 * (0.8 * 1.0 + 0.2 * 1.5), rel=0.02)


def _reference_cost(c: CostModel, n: int) -> float:
    """target_cost as the CostModel docstring states it, computed from scratch (no kept table)."""
    calibrated = bool(c.calibrated.get(1))
    drift = c.target_s[1] / c.calibrated[1] if calibrated and 1 in c._online else 1.0
    measured = {}
    for m, seconds in c.target_s.items():
        if not calibrated:
            measured[m] = seconds
        elif m in c._drift_at:  # observed online: scaled by the drift since then
            measured[m] = seconds * drift / c._drift_at[m]
        else:
            measured[m] = seconds if m in c._online else seconds * drift
    if n in measured:
        return measured[n]
    known = sorted(measured)
    if len(known) == 1:
        return measured[known[0]]
    below, above = [m for m in known if m < n], [m for m in known if m > n]
    lo, hi = (known[0], known[1]) if not below else (known[-2], known[-1]) if not above else (below[-1], above[0])
    return max(measured[lo] + (measured[hi] - measured[lo]) / (hi - lo) * (n - lo), 1e-9)


def test_the_costs_kept_between_changes_are_the_table_s_costs_after_every_change():
    """target_cost keeps the costs it derived until the table changes (observe_target, calibrate, a table
    assigned whole): at every point of random histories they equal the rule computed from scratch."""
    rng = random.Random(7)
    for trial in range(60):
        widths = sorted(rng.sample(range(1, 20), rng.randint(1, 8)))
        c = CostModel()
        c.target_s = {n: rng.uniform(0.01, 0.5) for n in widths}
        if trial % 3:
            c.calibrated = dict(c.target_s)
        for _ in range(30):
            what = rng.random()
            if what < 0.6:
                c.observe_target(rng.choice([1, 1, *range(1, 22)]), rng.uniform(0.01, 0.5))
            elif what < 0.65:
                c.target_s = {**c.target_s, rng.randint(1, 24): rng.uniform(0.01, 0.5)}
            for n in rng.sample(range(1, 40), 5):
                assert c.target_cost(n) == pytest.approx(_reference_cost(c, n), rel=1e-12), (trial, n)
    costs = CostModel()
    costs.calibrate(random_table_backend(20, seed=0), k_max=4)
    assert [costs.target_cost(n) for n in range(1, 6)] == [costs.calibrated[n] for n in range(1, 6)]


def test_predicted_speedups_by_k_are_the_rate_of_each_k_over_plain_decoding():
    c = CostModel(target_s={1: 0.03, 2: 0.05, 4: 0.08, 8: 0.14, 16: 0.15, 17: 0.2}, frozen=True, draft_s_per_token=1e-3)
    for alpha in (0.3, 0.9, [0.5, 0.7, 0.8, 0.9], (0.99,)):
        speedups = c.speedups(alpha, 16)
        plain = c.tokens_per_s(alpha, 0)
        assert speedups == pytest.approx([c.tokens_per_s(alpha, k) / plain for k in range(17)], rel=1e-12)
        k, best = c.best_k(alpha, 16)
        assert best == pytest.approx(max(speedups)) and speedups[k] == pytest.approx(best)


def test_acceptance_rates_are_read_alike_from_lists_tuples_numbers_and_other_sequences():
    class Rates(Sequence):  # a Sequence that is neither a list nor a tuple
        def __init__(self, *rates):
            self.rates = rates

        def __len__(self):
            return len(self.rates)

        def __getitem__(self, i):
            return self.rates[i]

    expected = expected_tokens([0.5, 0.8], 4)
    assert expected_tokens((0.5, 0.8), 4) == expected_tokens(Rates(0.5, 0.8), 4) == expected
    assert expected_tokens(0.5, 4) == expected_tokens([0.5], 4) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    assert expected_tokens(1, 4) == 5.0
    c = CostModel(target_s={1: 0.03, 4: 0.06, 9: 0.2}, frozen=True)
    assert c.best_k(Rates(0.5, 0.8), 8) == c.best_k([0.5, 0.8], 8) == c.best_k((0.5, 0.8), 8)


def _drifted(costs: CostModel) -> None:
    """The one-token pass observed far slower than calibrated (the machine got slower, or calibration ran busy),
    and enough steps since the last calibration: the table is stale."""
    for _ in range(10):
        costs.observe_target(1, 50 * costs.calibrated[1])
    for _ in range(RECALIBRATE_GAP * 2**costs._recalibrations):
        costs.tick()


def test_a_stale_table_is_measured_again_between_requests_never_inside_one(caplog):
    target = random_table_backend(20, seed=0)
    engine = Engine(target, DraftModelFactory(random_table_backend(20, seed=1)), SpecConfig(k=None, k_max=3))
    engine.calibrate()
    costs = engine.costs
    measured = dict(costs.calibrated)
    _drifted(costs)
    assert costs.stale() and costs.drift > 1 + DRIFT
    engine.new_controller()  # a request starts: it does not pay for a measurement
    assert costs.stale() and costs.calibrated == measured
    drift = costs.drift
    with caplog.at_level(logging.INFO, logger="spekula.engine"):
        assert engine.remeasure_if_stale()
    # a server's log says when it measured (a benchmark alternating servers can see whose request it slowed)
    (record,) = caplog.records
    assert f"ran at {drift:.2f}x its measured time" in record.getMessage()
    assert "measured again while idle, done after" in record.getMessage()
    assert not costs.stale() and costs.drift == 1.0  # measured again: the online width counts from the new table
    assert costs.target_s[1] < 10 * measured[1]
    assert not engine.remeasure_if_stale()  # nothing to do on a fresh table
    # a drift that measuring again does not remove waits twice as long before the next re-measurement
    for _ in range(10):
        costs.observe_target(1, 50 * measured[1])
    for _ in range(RECALIBRATE_GAP):
        costs.tick()
    assert not costs.stale()
    for _ in range(RECALIBRATE_GAP):
        costs.tick()
    assert costs.stale()


def test_a_re_measurement_that_is_interrupted_leaves_the_table_as_it_was(monkeypatch, caplog):
    target = random_table_backend(20, seed=0)
    engine = Engine(target, DraftModelFactory(random_table_backend(20, seed=1)), SpecConfig(k=None, k_max=3))
    engine.calibrate()
    costs = engine.costs
    _drifted(costs)
    table, calibrated = dict(costs.target_s), dict(costs.calibrated)
    asked: list[int] = []
    released: list[object] = []
    release = type(target.new_sequence()).release
    monkeypatch.setattr(type(target.new_sequence()), "release", lambda seq: released.append(seq) or release(seq))
    with caplog.at_level(logging.INFO, logger="spekula.engine"):
        assert not engine.remeasure_if_stale(interrupted=lambda: asked.append(1) or len(asked) > 2)  # a request arrived
    assert "stopped by a request" in caplog.records[-1].getMessage()
    assert len(asked) == 3 and released  # stopped at the third pass, its sequence freed
    assert costs.target_s == table and costs.calibrated == calibrated and costs.stale()
    assert engine.remeasure_if_stale(interrupted=lambda: False) and not costs.stale()


def test_a_batching_server_measures_its_wide_passes_once(monkeypatch):
    """A batching server calibrates passes up to max_batch x (k_max + 1) rows at start-up; a stale table
    is measured again only up to k_max + 1 rows (the wide widths, tens of seconds on a CPU, would hold
    every running request), and the wide widths keep their times."""
    target = random_table_backend(20, seed=0)
    engine = Engine(target, DraftModelFactory(random_table_backend(20, seed=1)), SpecConfig(k=None, k_max=3))
    engine.calibrate(max_batch=8)
    costs = engine.costs
    wide = {n: t for n, t in costs.calibrated.items() if n > 4}
    assert max(wide) == 32  # 8 x (3 + 1) rows
    timed: list[int] = []
    forward = type(target.new_sequence()).forward
    monkeypatch.setattr(
        type(target.new_sequence()),
        "forward",
        lambda seq, ids, num_logits=None: timed.append(len(ids)) or forward(seq, ids, num_logits),
    )
    _drifted(costs)
    assert engine.remeasure_if_stale()
    assert not costs.stale() and max(timed) <= 64  # the context prefix (64 tokens), then widths up to 4
    assert all(n <= 4 for n in timed if n != 64)
    assert {n: costs.target_s[n] for n in wide} == wide


def test_expected_tokens_by_draft_position():
    # the last rate holds for later positions
    assert expected_tokens([0.5, 1.0], 3) == pytest.approx(1 + 0.5 + 0.5 + 0.5)
    assert expected_tokens([0.6] * 4, 6) == pytest.approx(expected_tokens(0.6, 6))


def test_one_sequence_is_a_batch_of_one():
    c = memory_bound()
    for alpha in (0.0, 0.3, 0.6, 0.95, 1.0, [0.9, 0.5, 0.7, 0.8], [0.2, 0.95]):
        ks, speedup = c.best_ks([(alpha, 8)])
        assert c.best_k(alpha, k_max=8) == (ks[0], speedup)
    # and its rate is tokens_per_s, maximised
    k, speedup = c.best_k(0.8, k_max=8)
    assert speedup == pytest.approx(c.tokens_per_s(0.8, k) / c.tokens_per_s(0.8, 0))
    assert all(c.tokens_per_s(0.8, k) >= c.tokens_per_s(0.8, j) for j in range(9))


def test_a_ragged_round_prices_each_draft_as_a_pass_of_its_own_rows():
    """llama.cpp's KV streams (exact mode) run a batched pass as a pass of every sequence's first row plus one of
    each draft's rows (best_ks_ragged). On its measured costs (ms: 1 row 57, 4 rows 103, 16 rows 255) four plain
    rows cost 1.8 one-row passes, so a draft must win back a pass of its own rows against that rate: a request
    that copies (every token accepted) drafts beside three that do not, and nobody drafts where nothing passes."""
    costs = CostModel(target_s={1: 0.057, 2: 0.092, 3: 0.114, 4: 0.103, 5: 0.136, 8: 0.175, 16: 0.255}, frozen=True)
    copying, failing = ([1.0] * 4, 16), ([0.3] * 4, 16)
    ks, speedup = costs.best_ks_ragged([copying, failing, failing, None])
    assert ks[0] >= 8 and ks[1:] == [0, 0, 0] and speedup > 1.3
    tokens, seconds = 4 + ks[0], costs.target_cost(4) + costs.target_cost(ks[0])
    assert speedup == pytest.approx((tokens / seconds) / (4 / costs.target_cost(4)))
    assert costs.best_ks_ragged([failing] * 4) == ([0, 0, 0, 0], 1.0)
    assert costs.best_ks_ragged([None, None]) == ([0, 0], 1.0) and costs.best_ks_ragged([]) == ([], 1.0)
    # alone, a 0.75 acceptance pays (a 4-row pass for 1.8 more tokens); beside three plain rows it does not
    middling = ([0.75] * 4, 16)
    assert costs.best_k(*middling)[0] > 0 and costs.best_ks_ragged([middling, None, None, None])[0] == [0] * 4


def test_a_batch_drafts_only_where_no_request_falls_below_its_floor():
    """max_slowdown: a draft's rows lengthen the round for every request in it, and a request that cannot copy
    emits one token however long the round is. Beside one that drafts nothing, a request that copies drafts only
    where its rows slow the other by less than the bound; four that copy all draft, each gaining more than the
    round's added seconds cost it. Both batch searches, on llama.cpp's measured costs (ms: 1 row 57, 4 rows 103,
    16 rows 255), and every split they choose keeps each request's expected tokens a second at its floor."""
    costs = CostModel(target_s={1: 0.057, 2: 0.092, 3: 0.114, 4: 0.103, 5: 0.136, 8: 0.175, 16: 0.255}, frozen=True)
    copying, failing = ([1.0] * 4, 16), ([0.3] * 4, 16)
    for search in (costs.best_ks_ragged, costs.best_ks):
        unbounded, _ = search([copying, failing, failing, None])
        assert unbounded[0] > 0  # throughput alone: the copying request drafts beside the others
        assert search([copying, failing, failing, None], 0.02) == ([0, 0, 0, 0], 1.0)
        assert search([copying, failing, failing, None], 1.0)[0] == unbounded  # 1: no bound
        ks, speedup = search([copying] * 4, 0.02)
        assert all(k > 0 for k in ks) and speedup > 1.5
        assert search([copying], 0.0) == search([copying])  # alone, a request slows nobody else
    # the floor holds for every split chosen, on random batches and bounds (ragged: its own pass per draft)
    gen, drafted = random.Random(11), [0, 0]
    for _ in range(200):
        rates = [gen.random() if gen.random() < 0.2 else gen.uniform(0.9, 1.0) for _ in range(4)]
        outlooks = [None if gen.random() < 0.05 else ([rate] * 4, gen.randint(4, 16)) for rate in rates]
        bound = gen.choice([0.0, 0.02, 0.2, 0.5])
        ks, _ = costs.best_ks_ragged(outlooks, bound)
        seconds = costs.target_cost(4) + sum(costs.target_cost(k) for k in ks if k)
        for o, k in zip(outlooks, ks, strict=True):
            mine = 1.0 if not k else expected_tokens(o[0], k)
            assert mine / seconds >= (1 - bound) / costs.target_cost(4) - 1e-9, (outlooks, ks, bound)
        drafted[0] += any(ks)
        ks, _ = costs.best_ks(outlooks, bound)
        seconds = costs.target_cost(4 + sum(ks))
        for o, k in zip(outlooks, ks, strict=True):
            mine = 1.0 if not k else expected_tokens(o[0], k)
            assert mine / seconds >= (1 - bound) / costs.target_cost(4) - 1e-9, (outlooks, ks, bound)
        drafted[1] += any(ks)
    assert min(drafted) >= 10  # the check was made on rounds that draft, in both searches


def test_ties_go_to_the_longer_draft():
    flat = CostModel(target_s={1: 1.0, 9: 1.0}, frozen=True)  # every width costs one plain pass, drafts are free
    assert flat.best_k(0.0, k_max=8) == (8, 1.0)  # nothing is ever accepted: every k is worth plain decoding


def test_a_batch_sums_what_each_sequence_is_expected_to_emit():
    c = CostModel(target_s={1: 1.0, 2: 1.0, 4: 1.0, 8: 2.0}, frozen=True)
    # two sequences, one that always accepts (drafts of up to 2) and one that never does: the first drafts
    # 2 and emits 3 tokens, the second 1, in one 4-row pass; plain decoding emits 2 tokens in a 2-row pass
    # of the same cost
    ks, speedup = c.best_ks([(1.0, 2), (0.0, 2)])
    assert (ks, speedup) == ([2, 0], pytest.approx(2.0))
    # per-position rates count the same way as a flat rate of the same value
    assert c.best_ks([([1.0], 3), ([0.0, 0.0], 3)]) == c.best_ks([(1.0, 3), (0.0, 3)])
