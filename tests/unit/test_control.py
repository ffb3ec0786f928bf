"""The cost model and the --k auto controller."""

import pytest

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.control import AdaptiveK, CostModel, expected_tokens
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


def memory_bound():  # bf16 on CPU: 9 tokens cost about what 1 costs
    return CostModel(target_s={n: 0.19 + 0.005 * (n - 1) for n in range(1, 10)}, draft_s_per_token=0.08, frozen=True)


def compute_bound():  # llama.cpp Q4 on 2 cores: 5 tokens ~4x one
    return CostModel(target_s={n: 0.032 * (0.75 * n + 0.25) for n in range(1, 10)}, draft_s_per_token=0.023, frozen=True)


def test_memory_bound_target_drafts_long_when_acceptance_is_high():
    assert memory_bound().best_k(alpha=0.6, k_max=8)[0] in (1, 2)
    k, speedup = memory_bound().best_k(alpha=0.95, k_max=8)
    assert k >= 3 and speedup > 1.5


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


def test_controller_turns_speculation_off_then_probes_and_recovers():
    ctl = AdaptiveK(memory_bound(), k_max=8, probe_every=4)
    assert ctl.choose_k() > 0
    for _ in range(10):  # every draft rejected at once
        ctl.observe(4, 4, 0, 0.32, 0.21)
    ks = [ctl.choose_k() for _ in range(4 + 8 + 16)]
    probes = [i for i, k in enumerate(ks) if k]
    assert all(ks[i] == 1 for i in probes) and probes == [3, 11, 27]  # probes back off: after 4, 8, 16 plain steps
    for _ in range(15):  # acceptance comes back
        ctl.observe(1, 1, 1, 0.08, 0.2)
    assert ctl.choose_k() >= 3


def test_auto_k_stays_lossless_and_learns_acceptance():
    target = random_table_backend(40, seed=0, order=2)
    prompt = [1, 2, 3]
    plain = Engine(target).generate(prompt, SamplingParams(), StopConfig(max_tokens=60)).run()
    for draft_seed, expect_spec in [(0, True), (99, False)]:
        engine = Engine(target, DraftModelFactory(random_table_backend(40, seed=draft_seed, order=2)), SpecConfig(k=None, k_max=6))
        engine.costs = memory_bound()
        g = engine.generate(prompt, SamplingParams(), StopConfig(max_tokens=60)).run()
        assert g.token_ids == plain.token_ids
        plain_steps = g.stats.k_chosen.get(0, 0)
        if expect_spec:  # the same model drafts: alpha = 1, long drafts
            assert max(g.stats.k_chosen) >= 4 and g.stats.predicted_speedup > 1.5
        else:  # a random draft: mostly plain decoding after the first rejections
            assert plain_steps > g.stats.target_passes / 2


def test_no_probing_where_even_perfect_acceptance_cannot_pay():
    ctl = AdaptiveK(compute_bound(), k_max=8, probe_every=2)
    assert [ctl.choose_k() for _ in range(50)] == [0] * 50


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
