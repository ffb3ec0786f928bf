"""The --k auto controller: how far, speculate, probe; and what it learns per request and per draft class."""

import dataclasses
import json

import pytest

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.control import AdaptiveK, FixedK
from spekula.cost import HALF_LIFE, CostModel, base_acceptance
from spekula.draft_class import AFTER_EDIT, NO_DRAFT, RECALLED, DraftClass, ngram_class
from spekula.engine import Engine
from spekula.proposers import DraftModelFactory, NgramFactory, build_proposer
from spekula.proposers.suffix import match_class
from spekula.testing import random_table_backend
from spekula.trace import JsonlTrace, ListTrace

from costkit import compute_bound, memory_bound


def test_controller_turns_speculation_off_then_probes_and_recovers():
    ctl = AdaptiveK(memory_bound(), k_max=8, probe_every=4, probe_budget=1.0)
    assert ctl.choose_k() > 0
    for _ in range(10):  # every draft rejected at once
        ctl.observe(4, 4, 0, 0.32, 0.21)
    ks = [ctl.choose_k() for _ in range(4 + 8 + 16)]
    probes = [i for i, k in enumerate(ks) if k]
    assert all(ks[i] == 1 for i in probes) and probes == [3, 11, 27]  # probes back off: after 4, 8, 16 plain steps
    for _ in range(15):  # acceptance comes back (seen at the first draft position only)
        ctl.observe(1, 1, 1, 0.08, 0.2)
    assert ctl.choose_k() >= 2


def test_no_probe_when_too_few_tokens_remain_to_win_it_back():
    ctl = AdaptiveK(memory_bound(), k_max=8, probe_every=4, probe_budget=1.0)
    for _ in range(10):
        ctl.observe(4, 4, 0, 0.32, 0.21)
    assert [ctl.choose_k(remaining=r) for r in (9, 8, 7, 3)] == [0, 0, 0, 0]  # the 4th would probe, but 3 < gap
    ctl2 = AdaptiveK(memory_bound(), k_max=8, probe_every=4, probe_budget=1.0)
    for _ in range(10):
        ctl2.observe(4, 4, 0, 0.32, 0.21)
    assert [ctl2.choose_k(remaining=100) for _ in range(4)] == [0, 0, 0, 1]


def test_slow_start_caps_a_new_requests_drafts_where_a_wide_pass_is_dear():
    # transformers' fp32 on this CPU: 2 tokens cost ~2x one; n-gram drafts are free. The engine-wide
    # alpha came from a request that copied its prompt (alpha ~ 1), but this request is new.
    dear = CostModel(target_s={1: 0.60, 2: 1.15, 5: 1.84, 9: 2.21}, frozen=True)
    dear.alpha = 1.0
    assert dear.best_k(1.0, k_max=8)[0] == 8
    ctl = AdaptiveK(dear, k_max=8)
    # a wrong prior costs at most two plain passes: T(4) = 1.61 <= 3 T(1) = 1.8 < T(5) = 1.84
    assert ctl.k_cap == 3 and ctl.choose_k() == 3
    ctl.observe(3, 3, 0, 0.0, dear.target_cost(4))  # rejected: the cap stays (and alpha falls)
    assert ctl.k_cap == 3
    ctl = AdaptiveK(dear, k_max=8)
    dear.alpha, dear.acceptance = 1.0, {}
    ks = []
    for _ in range(4):  # each fully accepted draft doubles the rows a draft may cost (4 -> 8), up to k_max
        k = ctl.choose_k()
        ctl.observe(k, k, k, 0.0, dear.target_cost(k + 1))
        ks.append(k)
    assert ks[0] == 3 and all(k == min(2 * (before + 1) - 1, 8) for before, k in zip(ks, ks[1:], strict=False))
    # Packed fp32 weights and a llama.cpp draft: a fully rejected 8-token draft costs less than one
    # extra plain pass, so slow start changes nothing there.
    cheap = CostModel(target_s={1: 0.662, 2: 0.684, 5: 0.709, 9: 0.808}, draft_s_per_token=0.040, frozen=True)
    cheap.alpha = 0.9
    ctl = AdaptiveK(cheap, k_max=8)
    assert ctl.k_cap == 8 and ctl.choose_k() == cheap.best_k(ctl.alpha, 8)[0] >= 6


def test_a_cold_drafts_prefill_is_not_priced_as_drafted_tokens():
    costs = CostModel(target_s={1: 0.6, 9: 0.8}, draft_s_per_token=0.04)
    ctl = AdaptiveK(costs, k_max=8)
    ctl.observe(8, 8, 8, 4.0 + 8 * 0.04, 0.8, catch_up=300)  # 4 s of catching up on a 300-token prompt
    assert costs.draft_s_per_token == 0.04
    ctl.observe(8, 8, 8, 8 * 0.05, 0.8, catch_up=1)  # a warm draft: the recovered token, then 8 drafts
    assert 0.04 < costs.draft_s_per_token <= 0.05


def test_the_engine_reports_a_cold_drafts_catch_up_with_the_step():
    target = random_table_backend(40, seed=0, order=2)
    engine = Engine(target, DraftModelFactory(random_table_backend(40, seed=0, order=2)), SpecConfig(k=3))
    g = engine.generate(list(range(1, 21)), SamplingParams(), StopConfig(max_tokens=12))
    first = g.plan()
    assert first.catch_up == 19  # the whole prompt but its pending last token
    g.complete(first, first.score())
    second = g.plan()
    assert second.catch_up <= 1
    g.close()


def test_a_cold_draft_is_probed_only_if_usual_acceptance_would_win_back_its_catch_up():
    def probes(engine_alpha: float) -> list[int]:
        dear = CostModel(target_s={1: 0.60, 2: 1.15, 5: 1.84, 9: 2.21}, draft_s_per_token=0.04, frozen=True)
        dear.draft_prefill_s_per_token = 0.01
        ctl = AdaptiveK(dear, k_max=8, probe_every=2, probe_budget=1.0)
        for _ in range(3):
            ctl.observe(1, 1, 0, 0.04, 1.15)  # this request's drafts were rejected: plain decoding
        dear.alpha = engine_alpha
        return [ctl.choose_k(remaining=100, catch_up=100) for _ in range(2)]

    # Requests here usually accept 95%: a probe may pay 1 s of catch-up (8-token drafts would win it back).
    assert probes(0.95) == [0, 1]
    # At the usual 60% no k beats plain decoding on these costs: the catch-up would never come back.
    assert probes(0.6) == [0, 0]


def test_a_cold_draft_speculates_only_when_the_rest_of_the_request_pays_for_its_catch_up():
    costs = memory_bound()
    costs.draft_prefill_s_per_token = 0.01  # 500 context tokens to catch up: 5 s
    ctl = AdaptiveK(costs, k_max=8, prior_weight=1000.0)
    costs.alpha = 0.95
    assert ctl.choose_k(remaining=10, catch_up=500) == 0  # 10 tokens cannot win back 5 s
    assert ctl.choose_k(remaining=400, catch_up=500) > 0
    assert ctl.choose_k(remaining=10, catch_up=0) > 0  # a warm draft: nothing to win back


def test_auto_k_stays_lossless_and_learns_acceptance():
    target = random_table_backend(40, seed=0, order=2)
    prompt = [1, 2, 3]
    plain = Engine(target).generate(prompt, SamplingParams(), StopConfig(max_tokens=60)).run()
    for draft_seed, expect_spec in [(0, True), (99, False)]:
        draft = DraftModelFactory(random_table_backend(40, seed=draft_seed, order=2))
        engine = Engine(target, draft, SpecConfig(k=None, k_max=6))
        engine.costs = memory_bound()
        g = engine.generate(prompt, SamplingParams(), StopConfig(max_tokens=60)).run()
        assert g.token_ids == plain.token_ids
        plain_steps = g.stats.k_chosen.get(0, 0)
        if expect_spec:  # the same model drafts: alpha = 1, long drafts
            assert max(g.stats.k_chosen) >= 4 and g.stats.predicted_speedup > 1.4  # the mean, over the ramp-up too
        else:  # a random draft: mostly plain decoding after the first rejections
            assert plain_steps > g.stats.target_passes / 2


def test_no_probing_where_even_perfect_acceptance_cannot_pay():
    ctl = AdaptiveK(compute_bound(), k_max=8, probe_every=2)
    assert [ctl.choose_k() for _ in range(50)] == [0] * 50
    # llama.cpp Q4 1.5B target with a Q4 0.5B draft, as measured here: alpha = 1 would gain ~10%,
    # less than a probe (and the draft's catch-up prefill) costs.
    llama = CostModel(target_s={1: 0.090, 2: 0.137, 5: 0.249, 9: 0.578}, draft_s_per_token=0.040, frozen=True)
    assert 1.0 < llama.best_k(1.0, k_max=8)[1] < 1.2
    ctl = AdaptiveK(llama, k_max=8, probe_every=2)
    for _ in range(4):
        ctl.observe(1, 1, 0, 0.04, 0.137)
    assert [ctl.choose_k() for _ in range(50)] == [0] * 50


def llamacpp_like():  # llama.cpp Q4 on 2 cores, measured: a 2-token pass 1.45x a one-token pass, 9 tokens 6.1x
    return CostModel(target_s={1: 0.095, 2: 0.137, 5: 0.249, 9: 0.578}, frozen=True)


def test_acceptance_is_learnt_per_draft_class():
    costs = llamacpp_like()  # n-gram lookup: drafts are free, wide passes are dear
    for _ in range(20):  # what other requests saw: long matches copy, one-token matches rarely do
        ctl = AdaptiveK(costs, k_max=8)
        ctl.observe(2, 2, 2, 0.0, 0.14, draft_class=ngram_class(4))
        ctl.observe(1, 1, 0, 0.0, 0.14, draft_class=ngram_class(1))
    assert costs.prior_acceptance(ngram_class(4))[0] > 0.85 and costs.prior_acceptance(ngram_class(1))[0] < 0.15
    assert 0.3 < costs.alpha < 0.7  # one rate for both would be wrong for each
    new = AdaptiveK(costs, k_max=8)
    assert new.choose_k(draft_class=ngram_class(1)) == 0
    assert new.choose_k(draft_class=ngram_class(4)) >= 1 and new.predicted_speedup > 1.2
    # a request whose long matches do not copy learns that for itself, and stops betting on them
    for _ in range(4):
        new.observe(1, 1, 0, 0.0, 0.14, draft_class=ngram_class(4))
    assert new.acceptance(ngram_class(4))[0] < 0.5 and new.choose_k(draft_class=ngram_class(4)) == 0


def test_the_engine_wide_rates_are_learnt_per_request_not_per_step():
    """The engine-wide rates are what a request's first drafts of a class are expected to get. One request that copies
    drafts at every step; counted per step, its forty passing drafts would outweigh four requests whose first draft
    of the class failed, and a fifth request like those four would bet on rates it does not get."""
    costs = llamacpp_like()
    copier = AdaptiveK(costs, k_max=8)
    for _ in range(40):
        copier.observe(3, 3, 3, 0.0, 0.2, draft_class=match_class(2))
    learnt = costs.prior_acceptance(match_class(2))[0]
    assert learnt > base_acceptance(match_class(2))[0]  # the copier's drafts taught the class something ...
    for _ in range(4):
        AdaptiveK(costs, k_max=8).observe(3, 3, 0, 0.0, 0.2, draft_class=match_class(2))
    # ... and four requests that each failed once now weigh more: under half of a first draft token expected
    assert costs.prior_acceptance(match_class(2))[0] < 0.5 < learnt
    # three failed drafts of one request count less than one failed draft of each of three requests
    one, three = llamacpp_like(), llamacpp_like()
    ctl = AdaptiveK(one, k_max=8)
    for _ in range(3):
        ctl.observe(3, 3, 0, 0.0, 0.2, draft_class=match_class(8))
        AdaptiveK(three, k_max=8).observe(3, 3, 0, 0.0, 0.2, draft_class=match_class(8))
    base = base_acceptance(match_class(8))[0]
    assert three.prior_acceptance(match_class(8))[0] < one.prior_acceptance(match_class(8))[0] < base


def test_a_requests_own_evidence_carries_across_draft_classes():
    costs = llamacpp_like()
    costs.acceptance = {ngram_class(1): [0.2] * 4, ngram_class(2): [0.4] * 4}  # what other requests got
    ctl = AdaptiveK(costs, k_max=8)
    assert ctl.choose_k(draft_class=ngram_class(1)) == 0
    for _ in range(6):  # this request's 2-gram drafts pass far more often than the engine expects
        ctl.observe(2, 2, 2, 0.0, 0.14, draft_class=ngram_class(2))
    assert ctl.acceptance(ngram_class(1))[0] > 0.5  # so it expects more of its 1-gram drafts too ...
    assert ctl.choose_k(draft_class=ngram_class(1)) >= 1  # ... and bets on them
    # what a new request expects is unchanged by this request's 2-gram drafts (only relaxed towards the base a bit)
    assert costs.prior_acceptance(ngram_class(1)) == pytest.approx([0.2] * 4, abs=0.005)


def test_a_draft_after_an_edit_is_not_judged_by_the_edits_rejections():
    """A request that copies a text with edits has a draft rejected at every edit; once the suffix
    proposer's copy cursor has found its place again ("resync-N"), those rejections say nothing of the copy
    it realigned on: such a draft expects what its class gets engine-wide, while the request's other
    classes are marked down."""
    costs = llamacpp_like()
    costs.acceptance = {match_class(8): [0.9] * 4, match_class(8, AFTER_EDIT): [0.9] * 4}
    ctl = AdaptiveK(costs, k_max=8)
    for _ in range(3):  # every draft of this request rejected at its first token: edits
        ctl.observe(4, 4, 0, 0.0, 0.2, draft_class=match_class(8))
    assert ctl.acceptance(match_class(8))[0] < 0.6
    assert ctl.acceptance(match_class(8, AFTER_EDIT)) == costs.prior_acceptance(match_class(8, AFTER_EDIT))
    assert ctl.choose_k(draft_class=match_class(8, AFTER_EDIT)) >= 1


def test_a_request_whose_own_text_copies_does_not_lend_that_to_memory():
    """Issue 34: drafts from earlier requests' outputs ("recall-N") are judged by this request's record with
    memory, not by its own text's: a request that copies its prompt says nothing of whether memory holds its
    answer, and memory that misleads it says nothing of its own text."""
    costs = llamacpp_like()
    costs.acceptance = {match_class(8): [0.8] * 4, match_class(8, RECALLED): [0.8] * 4}
    ctl = AdaptiveK(costs, k_max=8)
    for _ in range(6):  # its own text copies, far more often than the engine expects
        ctl.observe(4, 4, 4, 0.0, 0.2, draft_class=match_class(8))
    assert ctl.acceptance(match_class(8))[0] > 0.9
    assert ctl.acceptance(match_class(8, RECALLED)) == costs.prior_acceptance(match_class(8, RECALLED))
    own = ctl.acceptance(match_class(8))
    ctl.observe(4, 4, 0, 0.0, 0.2, draft_class=match_class(8, RECALLED))  # memory misled it
    assert ctl.acceptance(match_class(8)) == pytest.approx(own, abs=0.01)


def test_one_rejected_recalled_draft_switches_memory_off_for_the_request():
    costs = llamacpp_like()
    costs.acceptance = {
        c: [0.9] * 4 for c in (match_class(4, RECALLED), match_class(8, RECALLED), match_class(16, RECALLED))
    }  # memory usually helps
    ctl = AdaptiveK(costs, k_max=8)
    assert ctl.choose_k(100, 0, match_class(16, RECALLED)) >= 1
    ctl.observe(3, 3, 0, 0.0, 0.2, draft_class=match_class(16, RECALLED))  # ... but not this request
    # no memory draft is bet on again (its classes are one source), and the next probe is a while off
    assert [
        ctl.choose_k(100, 0, c)
        for c in (match_class(16, RECALLED), match_class(8, RECALLED), match_class(4, RECALLED)) * 2
    ] == [0] * 6
    assert ctl.reason.startswith("plain: best k=")
    # where memory is right for a request, a miss (an edit) after a run of hits does not switch it off
    helped = AdaptiveK(costs, k_max=8)
    for _ in range(4):
        k = helped.choose_k(100, 0, match_class(16, RECALLED))
        helped.observe(k, k, k, 0.0, costs.target_cost(k + 1), draft_class=match_class(16, RECALLED))
    helped.observe(8, 8, 0, 0.0, costs.target_cost(9), draft_class=match_class(16, RECALLED))
    assert helped.choose_k(100, 0, match_class(16, RECALLED)) >= 4


def test_memory_starts_its_own_slow_start():
    """A fully rejected first draft from memory may cost a request at most SLOW_START_PASSES plain passes, even
    after the request's own text doubled its cap: that proved nothing of memory."""
    dear = CostModel(target_s={1: 0.60, 2: 1.15, 5: 1.84, 9: 2.21}, frozen=True)
    dear.acceptance = {match_class(16): [1.0] * 4, match_class(16, RECALLED): [1.0] * 4}
    ctl = AdaptiveK(dear, k_max=8)
    first = ctl.k_cap
    for _ in range(3):
        k = ctl.choose_k(100, 0, match_class(16))
        ctl.observe(k, k, k, 0.0, dear.target_cost(k + 1), draft_class=match_class(16))
    assert ctl.choose_k(100, 0, match_class(16)) == 8 > first
    assert ctl.choose_k(100, 0, match_class(16, RECALLED)) == first and ctl.reason.endswith(f"slow start cap {first}")
    assert ctl.outlook(match_class(16, RECALLED))[1] == first


def test_a_draft_after_an_edit_is_judged_by_its_own_record():
    """The copy cursor's drafts ("resync-N") are not marked down by what edits cost the request's other drafts
    (above), but a request whose own resync drafts keep failing stops betting on them."""
    costs = llamacpp_like()
    costs.acceptance = {match_class(8, AFTER_EDIT): [0.9] * 4}
    ctl = AdaptiveK(costs, k_max=8)
    assert ctl.choose_k(100, 0, match_class(8, AFTER_EDIT)) >= 1
    ks = []
    for _ in range(6):
        k = ctl.choose_k(100, 0, match_class(8, AFTER_EDIT))
        ctl.observe(k, k, 0, 0.0, costs.target_cost(k + 1), draft_class=match_class(8, AFTER_EDIT))
        ks.append(k)
    assert ks[-2:] == [0, 0]


def test_nothing_to_draft_is_plain_decoding_and_not_a_decision():
    ctl = AdaptiveK(memory_bound(), k_max=8, probe_every=4, probe_budget=1.0)
    assert ctl.choose_k(draft_class=NO_DRAFT) == 0 and ctl.predicted_speedup == 1.0
    for _ in range(10):
        ctl.observe(4, 4, 0, 0.32, 0.21)
    # speculation is off; steps where the proposer has nothing do not count towards the next probe
    ks = [ctl.choose_k(draft_class=NO_DRAFT) for _ in range(10)] + [ctl.choose_k() for _ in range(4)]
    assert ks == [0] * 13 + [1]
    assert FixedK(4).choose_k(draft_class=NO_DRAFT) == 0 and FixedK(4).choose_k(draft_class=ngram_class(2)) == 4


def test_the_trace_says_what_the_proposer_knew_before_drafting():
    target = random_table_backend(40, seed=0, order=1)
    trace = ListTrace()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 3
    engine = Engine(target, NgramFactory(4, 1), SpecConfig(k=4))
    engine.generate(prompt, SamplingParams(), StopConfig(max_tokens=16), trace).run()
    classes = {r.draft_class for r in trace.steps}
    assert (
        classes <= {NO_DRAFT, ngram_class(1), ngram_class(2), ngram_class(3), ngram_class(4)}
        and ngram_class(4) in classes
    )
    # as --trace writes them: by name, as the classes were always named
    names = {json.loads(json.dumps(r.to_dict()))["draft_class"] for r in trace.steps}
    assert names == {str(c) for c in classes} and names <= {"no draft", "1-gram", "2-gram", "3-gram", "4-gram"}
    for r in trace.steps:
        budget = 16 - (r.position - len(prompt))
        assert (r.k == 0 and not r.drafted) if r.draft_class == NO_DRAFT else r.k == min(4, budget - 1)


def test_probes_are_rarer_where_a_wider_pass_is_dear():
    # A probe that finds nothing costs T(2) + T_draft - T(1); probes may cost 2% of plain decoding.
    cheap = CostModel(target_s={1: 0.662, 2: 0.684, 9: 0.808}, frozen=True)  # packed fp32, n-gram lookup
    dear = CostModel(target_s={1: 0.569, 2: 1.154, 9: 2.211}, frozen=True)  # transformers' fp32
    assert AdaptiveK(cheap, probe_every=8).first_probe_gap == 8
    gap = AdaptiveK(dear, probe_every=8).first_probe_gap
    assert gap == 52  # (1.154 - 0.569) / (0.02 * 0.569) = 51.4
    ctl = AdaptiveK(dear, probe_every=8)
    for _ in range(5):
        ctl.observe(1, 1, 0, 0.0, None)
    ks = [ctl.choose_k(remaining=1000) for _ in range(gap)]
    assert ks == [0] * (gap - 1) + [1]


def test_learnt_state_is_not_configuration():
    configuration = [f.name for f in dataclasses.fields(AdaptiveK) if f.init]
    assert configuration == [
        "costs",
        "k_max",
        "probe_every",
        "probe_budget",
        "max_probe_every",
        "min_probe_gain",
        "prior_weight",
        "recall_prior_weight",
        "decay",
    ]
    with pytest.raises(TypeError):
        AdaptiveK(memory_bound(), _evidence={})


def test_how_far_is_the_fastest_k_up_to_the_slow_start_cap_and_the_draft_s_length():
    dear = CostModel(target_s={1: 0.60, 2: 1.15, 5: 1.84, 9: 2.21}, frozen=True)  # a wide pass is dear
    dear.alpha = 1.0
    ctl = AdaptiveK(dear, k_max=8)
    sure = ctl.acceptance()
    assert dear.best_k(sure, 8)[0] == 8
    assert ctl.choose_k() == 3 and ctl.predicted_speedup == dear.best_k(sure, 3)[1]  # a new request risks 3
    assert (ctl._limit(None, None), ctl._limit(None, 2), ctl._limit(None, 9)) == (3, 2, 3)
    cheap = CostModel(target_s={1: 0.662, 2: 0.684, 5: 0.709, 9: 0.808}, draft_s_per_token=0.040, frozen=True)
    cheap.alpha = 0.9
    ctl = AdaptiveK(cheap, k_max=8)
    assert ctl.k_cap == 8 and ctl.choose_k() == cheap.best_k(ctl.acceptance(), 8)[0]


def test_should_speculate_only_above_zero_and_when_a_cold_drafts_catch_up_pays_back():
    costs = memory_bound()
    costs.draft_prefill_s_per_token = 0.01  # 500 context tokens to catch up: 5 s
    ctl = AdaptiveK(costs, k_max=8)
    likely = [0.9] * 4
    assert not ctl._should_speculate(likely, 0, None, 0)  # k = 0: plain decoding won
    assert ctl._should_speculate(likely, 4, None, 0)
    assert ctl._should_speculate(likely, 4, 10, 0)  # a warm draft has nothing to win back
    assert not ctl._should_speculate(likely, 4, 10, 500)  # 10 tokens cannot win back 5 s
    assert ctl._should_speculate(likely, 4, 400, 500)


def test_probe_due_counts_plain_steps_and_backs_off():
    ctl = AdaptiveK(memory_bound(), k_max=8, probe_every=4, probe_budget=1.0)
    due = [ctl._probe_due(None, 0) for _ in range(4 + 8)]
    assert [i for i, d in enumerate(due) if d] == [3, 11]  # after 4 plain steps, then after 8


def test_probe_due_waits_while_too_few_tokens_remain_then_probes():
    ctl = AdaptiveK(memory_bound(), k_max=8, probe_every=4, probe_budget=1.0)
    assert [ctl._probe_due(3, 0) for _ in range(6)] == [False] * 6  # 3 tokens left < a gap of 4
    assert ctl._probe_due(100, 0)  # the clock stayed ripe: the first step with room probes


def test_no_probe_is_due_where_perfect_acceptance_cannot_pay_and_the_clock_stands_still():
    ctl = AdaptiveK(compute_bound(), k_max=8, probe_every=2, probe_budget=1.0)
    assert [ctl._probe_due(None, 0) for _ in range(50)] == [False] * 50
    assert ctl.first_probe_gap == 2
    ctl.min_probe_gain = 0.0  # any gain would do now: the clock starts from zero, not from 50 plain steps
    assert [ctl._probe_due(None, 0) for _ in range(2)] == [False, True]


def test_a_cold_draft_is_probed_only_where_usual_acceptance_wins_back_its_catch_up():
    dear = CostModel(target_s={1: 0.60, 2: 1.15, 5: 1.84, 9: 2.21}, draft_s_per_token=0.04, frozen=True)
    dear.draft_prefill_s_per_token = 0.01
    ctl = AdaptiveK(dear, k_max=8)
    dear.alpha = 0.95
    assert ctl._usual_acceptance_pays_back(100, 100)
    assert not ctl._usual_acceptance_pays_back(1, 100)  # one token cannot win back 1 s
    dear.alpha = 0.6  # no k beats plain decoding at the usual acceptance
    assert not ctl._usual_acceptance_pays_back(100, 100)


def test_speculating_again_restarts_the_probe_clock():
    ctl = AdaptiveK(memory_bound(), k_max=8, probe_every=4, probe_budget=1.0)
    for _ in range(10):
        ctl.observe(4, 4, 0, 0.32, 0.21)
    ks = [ctl.choose_k() for _ in range(4 + 8)]
    assert [i for i, k in enumerate(ks) if k] == [3, 11]  # the gap has grown to 16
    for _ in range(15):
        ctl.observe(1, 1, 1, 0.08, 0.2)
    assert ctl.choose_k() >= 2
    for _ in range(30):
        ctl.observe(4, 4, 0, 0.32, 0.21)
    ks = [ctl.choose_k() for _ in range(4)]
    assert ks == [0, 0, 0, 1]  # after 4 plain steps again, not 16


# -- robust learning: per-request evidence over engine-wide priors (issue 14) -----------------------


def llamacpp_measured():  # llama.cpp Q4 on 2 cores (issue 14): 4-row kernels, a 16-row pass far cheaper than 17
    ms = {1: 77, 2: 118, 4: 213, 8: 342, 9: 465, 12: 487, 13: 560, 16: 439, 17: 785}
    return CostModel(target_s={n: v / 1000 for n, v in ms.items()}, frozen=True)


def packed_fp32():  # native packed fp32 weights: wide passes cost little more than one token
    return CostModel(target_s={1: 0.662, 2: 0.684, 5: 0.709, 9: 0.808, 17: 1.0}, frozen=True)


# A fake acceptance process per draft class: (how often the proposer offers each class, chance that each
# drafted token of a class is accepted given the earlier ones were).
COPIES = (
    {ngram_class(4): 0.8, ngram_class(2): 0.1, ngram_class(1): 0.1},
    {ngram_class(4): 0.95, ngram_class(2): 0.8, ngram_class(1): 0.6},
)
COPIES_NOTHING = (
    {NO_DRAFT: 0.5, ngram_class(1): 0.35, ngram_class(2): 0.1, ngram_class(4): 0.05},
    {ngram_class(4): 0.05, ngram_class(2): 0.02, ngram_class(1): 0.01},
)


@dataclasses.dataclass
class Simulated:
    speedup: float  # plain decoding's time / this request's time, at the cost model's pass costs
    tau: float
    first_speculation: int | None  # step at which the controller first chose to speculate
    reasons: list[str]


def simulate(costs: CostModel, workload, tokens: int, rng) -> Simulated:
    """One request of `tokens` tokens through a fresh AdaptiveK on an engine's shared cost model."""
    offered, accept = workload
    ctl = AdaptiveK(costs, k_max=16)
    done = passes = 0
    seconds, first, reasons = 0.0, None, []
    while done < tokens:
        draft_class = rng.choices(list(offered), list(offered.values()))[0]
        k = min(ctl.choose_k(tokens - done, 0, draft_class), tokens - done - 1)
        reasons.append(ctl.reason)
        accepted = 0
        while accepted < k and rng.random() < accept[draft_class]:
            accepted += 1
        ctl.observe(k, k, accepted, 0.0, costs.target_cost(k + 1), 0, draft_class)
        if first is None and ctl.reason.startswith("speculate"):
            first = passes
        seconds += costs.target_cost(k + 1)
        passes += 1
        done += accepted + 1
    return Simulated(tokens * costs.target_cost(1) / seconds, done / passes, first, reasons)


@pytest.mark.parametrize("runtime", [llamacpp_measured, packed_fp32])
def test_copy_heavy_requests_after_copy_nothing_ones_speculate_within_a_few_steps(runtime):
    import random

    costs, rng = runtime(), random.Random(0)
    nothing = [simulate(costs, COPIES_NOTHING, 100, rng) for _ in range(4)]
    copies = [simulate(costs, COPIES, 100, rng) for _ in range(4)]
    assert all(r.speedup > 0.97 for r in nothing)  # speculation is never (much of) a loss
    # what the copy-nothing requests taught the engine is a prior, not a verdict
    assert all(r.first_speculation is not None and r.first_speculation <= 4 for r in copies)
    assert all(r.tau > 4.0 for r in copies)
    # at least 80% of an oracle that drafts the best k for the true acceptance of every long match
    oracle = costs.best_k(0.95, 16)[1]
    assert sum(r.speedup for r in copies) / 4 > 0.8 * (0.8 * oracle + 0.2)
    assert all(r.reasons and all(r.reasons) for r in nothing + copies)


@pytest.mark.parametrize("runtime", [llamacpp_measured, packed_fp32])
def test_copy_nothing_requests_after_copy_heavy_ones_cost_within_a_few_percent_of_plain(runtime):
    import random

    costs, rng = runtime(), random.Random(1)
    copies = [simulate(costs, COPIES, 100, rng) for _ in range(4)]
    nothing = [simulate(costs, COPIES_NOTHING, 100, rng) for _ in range(4)]
    assert all(r.speedup > 1.3 for r in copies) and sum(r.speedup for r in copies) / 4 > 1.5
    assert all(r.speedup > 0.95 for r in nothing) and sum(r.speedup for r in nothing) / 4 > 0.97


def test_one_unlucky_first_request_does_not_switch_n_gram_drafting_off():
    # issue 14: native fp32, a 9-token pass ~1.2x one; the first request's drafts were all rejected
    costs = CostModel(target_s={1: 0.66, 2: 0.68, 9: 0.80, 17: 0.95}, frozen=True)
    unlucky = AdaptiveK(costs)
    for draft_class in (ngram_class(2), ngram_class(1), ngram_class(3), ngram_class(1), ngram_class(2)):
        k = unlucky.choose_k(100, 0, draft_class)
        unlucky.observe(k, k, 0, 0.0, costs.target_cost(k + 1), 0, draft_class)
    edit = AdaptiveK(costs)  # an edit that re-emits its prompt: long matches that pass
    ks = []
    for _ in range(6):
        k = edit.choose_k(100, 0, ngram_class(4))
        edit.observe(k, k, k, 0.0, costs.target_cost(k + 1), 0, ngram_class(4))
        ks.append(k)
    assert ks[0] >= 1 and ks[-1] >= 8


def test_an_unseen_class_starts_from_its_match_length():
    costs = CostModel(alpha=0.1)  # whatever the engine-wide alpha, a long match is evidence of copying
    assert base_acceptance(ngram_class(8)) == pytest.approx([8 / 10, 9 / 11, 10 / 12, 11 / 13])
    # a suffix bucket's base is its shortest match's; after an edit, the run the copy cursor realigned on
    assert base_acceptance(match_class(8)) == base_acceptance(match_class(15)) == base_acceptance(ngram_class(8))
    assert base_acceptance(match_class(20, AFTER_EDIT)) == base_acceptance(ngram_class(16))
    assert base_acceptance(match_class(1, RECALLED)) == base_acceptance(ngram_class(1))
    assert base_acceptance(None) is None and base_acceptance(DraftClass("draft")) is None  # a class naming no match
    assert costs.prior_acceptance(match_class(16)) == base_acceptance(match_class(16))
    assert (
        costs.prior_acceptance(ngram_class(1))[0]
        < costs.prior_acceptance(ngram_class(4))[0]
        < costs.prior_acceptance(ngram_class(8))[0]
    )
    assert costs.prior_acceptance(None) == [0.1] * 4  # no match length: the engine-wide alpha
    # a rate learnt at the first position carries to later ones that short drafts never reach
    costs.acceptance = {ngram_class(4): [0.97, 0.5, None, None]}
    assert costs.prior_acceptance(ngram_class(4)) == [0.97] * 4


def test_learnt_rates_relax_towards_their_base():
    costs = CostModel()
    for _ in range(20):
        costs.observe_acceptance(1, 0, ngram_class(4))
    low = costs.prior_acceptance(ngram_class(4))[0]
    assert low < 0.1 and costs.alpha < 0.1
    for _ in range(HALF_LIFE):
        costs.tick()
    base = base_acceptance(ngram_class(4))[0]
    assert costs.prior_acceptance(ngram_class(4))[0] == pytest.approx((low + base) / 2, rel=1e-3)
    assert costs.alpha > 0.3


def test_an_accepted_probe_is_followed_by_another_and_a_rejected_one_waits():
    costs = llamacpp_measured()
    costs.acceptance = {ngram_class(4): [0.05] * 4}  # what earlier requests taught: long matches do not copy
    ctl = AdaptiveK(costs)
    assert ctl.choose_k(100, 0, ngram_class(1)) == 0  # a 1-token match alone could not pay here: not probed
    assert ctl.reason.startswith("plain: best k=1 predicts")
    assert ctl.choose_k(100, 0, ngram_class(4)) == 1 and ctl.reason.startswith("probe")  # a new request probes at once
    ctl.observe(1, 1, 1, 0.0, 0.118, 0, ngram_class(4))
    assert ctl.choose_k(100, 0, ngram_class(4)) == 1  # it passed: probe again
    ctl.observe(1, 1, 0, 0.0, 0.118, 0, ngram_class(4))
    assert [ctl.choose_k(100, 0, ngram_class(4)) for _ in range(ctl.first_probe_gap)][-2:] == [0, 1]


def test_probes_stay_rare_where_acceptance_is_genuinely_low():
    costs = llamacpp_measured()
    ctl = AdaptiveK(costs)
    drafted = 0
    for _ in range(500):
        k = ctl.choose_k(1000, 0, ngram_class(4))
        ctl.observe(k, k, 0, 0.0, costs.target_cost(k + 1), 0, ngram_class(4))
        drafted += k > 0
    assert drafted <= 12  # one per request at first, then after ever longer gaps


def test_the_reason_for_k_is_on_every_step_of_the_trace():
    import io

    target = random_table_backend(40, seed=0, order=1)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 3
    for spec in (SpecConfig(k=None, k_max=8), SpecConfig(k=4)):
        engine = Engine(target, NgramFactory(4, 1), spec)
        engine.costs = packed_fp32()
        trace, stream = ListTrace(), io.StringIO()
        engine.generate(prompt, SamplingParams(), StopConfig(max_tokens=16), trace).run()
        engine.generate(prompt, SamplingParams(), StopConfig(max_tokens=16), JsonlTrace(stream)).run()
        assert trace.steps and all(r.reason for r in trace.steps)
        prefixes = ("speculate: k=", "plain: ", "probe: ", "no draft: ", "fixed: k=")
        assert all(r.reason.startswith(prefixes) for r in trace.steps)
        steps = [json.loads(line) for line in stream.getvalue().splitlines() if '"type": "step"' in line]
        assert steps and all(s["reason"] for s in steps)
        for r in trace.steps:
            if r.draft_class == NO_DRAFT:
                assert r.reason == "no draft: no match"
            elif r.reason.startswith("speculate"):
                assert r.k > 0 and f"k={r.k}" in r.reason or "tokens left" in r.reason


def test_the_reason_says_when_slow_start_caps_k():
    dear = CostModel(target_s={1: 0.60, 2: 1.15, 5: 1.84, 9: 2.21}, frozen=True)
    dear.alpha = 1.0
    ctl = AdaptiveK(dear, k_max=8)
    assert ctl.choose_k() == 3 and ctl.reason.endswith("slow start cap 3")


def test_a_draft_is_priced_at_the_width_its_proposer_can_fill():
    """A lookup's continuation after a short match holds a token or two. With llama.cpp's 4-row kernel groups a
    3-row pass can cost more than a 4-row one, so a draft priced at k = 3 may pay where the 2 tokens the proposer
    actually has do not: the controller prices the draft it will get (Proposer.draft_length)."""
    groups = CostModel(target_s={1: 0.057, 2: 0.092, 3: 0.114, 4: 0.108, 5: 0.136, 8: 0.194, 9: 0.206}, frozen=True)
    rates = [0.55, 0.7, 0.7, 0.7]
    groups.acceptance = {match_class(2): rates}
    k, speedup = groups.best_k(rates, 3)
    assert k == 3 and speedup > 1.0  # three drafted tokens at these rates would pay ...
    assert groups.best_k(rates, 2)[0] == 0  # ... the two the proposer has would not
    ctl = AdaptiveK(groups, k_max=8)
    assert ctl.choose_k(100, 0, match_class(2)) == 3
    assert ctl.choose_k(100, 0, match_class(2), longest=2) == 1 and ctl.reason.startswith("probe: k=1")  # a new request
    assert ctl.choose_k(100, 0, match_class(2), longest=2) == 0 and ctl.reason.startswith("plain: best k=")
    assert ctl.outlook(match_class(2), longest=2) == (ctl.acceptance(match_class(2)), 2)
    assert ctl.choose_k(100, 0, match_class(2), longest=0) == 0 and ctl.reason == "no draft: no match"
    assert ctl.outlook(match_class(2), longest=0) is None
    # where the draft it has pays, that draft is chosen, and the reason says what bounded it
    groups.acceptance = {match_class(2): [0.95] * 4}
    fresh = AdaptiveK(groups, k_max=8)
    assert fresh.choose_k(100, 0, match_class(2), longest=2) == 2
    assert fresh.reason.endswith(", a draft of 2") and fresh.predicted_speedup == pytest.approx(
        groups.best_k(fresh.acceptance(match_class(2)), 2)[1]
    )
    assert FixedK(4).choose_k(100, 0, match_class(2), longest=2) == 4  # a fixed k is the user's: the draft is cut


def test_k_auto_never_asks_for_more_tokens_than_the_draft_holds():
    """Through the engine: every k the controller chose is the draft's own length (the budget aside), so the
    pass the prediction priced is the pass that ran. Short suffix matches (2-token drafts) included."""
    target = random_table_backend(40, seed=3, order=1)
    prompt = [5, 6, 1, 2, 7, 1, 2, 9, 1, 2, 3, 4, 5, 6, 7, 8] * 2
    engine = Engine(target, build_proposer("suffix", SpecConfig(k=None), target=target), SpecConfig(k=None, k_max=8))
    engine.costs = CostModel(target_s={1: 0.057, 2: 0.060, 3: 0.062, 4: 0.064, 5: 0.07, 9: 0.08}, frozen=True)
    engine.costs.alpha = 0.95
    trace = ListTrace()
    plain = Engine(target).generate(prompt, SamplingParams(), StopConfig(max_tokens=48)).run()
    g = engine.generate(prompt, SamplingParams(), StopConfig(max_tokens=48), trace).run()
    assert g.token_ids == plain.token_ids
    drafted = [r for r in trace.steps if r.k > 0]
    assert len(drafted) >= 3 and any(len(r.drafted) < 8 for r in drafted)  # short drafts were on offer
    for r in drafted:
        budget = 48 - (r.position - len(prompt))
        assert len(r.drafted) == r.k or r.k == budget - 1, (r.k, len(r.drafted), r.reason)


def test_a_draft_in_a_pass_of_its_own_is_priced_at_that_pass():
    # The step that finishes a prompt in llama.cpp's exact mode runs its draft's rows in a pass of their own
    # (Capabilities.prompt_pass_apart). Where a row adds little to a step's pass (2 ms on 20) and drafts are free
    # (a lookup), a draft there costs a whole T(k) instead, paid back only where it is expected to yield more than
    # T(k) / T(1) tokens: not at this acceptance, though the same draft pays in any later step's pass.
    def lookup() -> CostModel:
        return CostModel(target_s={n: 0.020 + 0.002 * (n - 1) for n in range(1, 18)}, frozen=True)

    costs = lookup()
    costs.alpha, costs.acceptance = 0.4, {}
    assert AdaptiveK(costs, k_max=8).choose_k() >= 1
    ctl = AdaptiveK(costs, k_max=8)
    assert ctl.choose_k(draft_pass_apart=True) == 0 and ctl.predicted_speedup == 1.0
    assert "pass of its own" in ctl.reason
    # near-certain drafts (a recalled answer's next turn) pay even there, the k the ragged pricing gives
    sure = lookup()
    sure.alpha, sure.acceptance = 0.99, {}
    ctl = AdaptiveK(sure, k_max=8)
    k = ctl.choose_k(draft_pass_apart=True)
    assert k >= 1 and k == sure.best_ks_ragged([(ctl.acceptance(), ctl.k_cap)])[0][0]
    assert "pass of its own" in ctl.reason and ctl.predicted_speedup > 1.0
    assert FixedK(4).choose_k(draft_pass_apart=True) == 4  # a fixed k is the user's


def test_the_engine_says_which_step_drafts_in_a_pass_of_its_own():
    target = random_table_backend(40, seed=0, order=1)
    asked: list[bool] = []

    class Spy(FixedK):
        def choose_k(self, *args, draft_pass_apart: bool = False, **kwargs) -> int:
            asked.append(draft_pass_apart)
            return super().choose_k(*args, **kwargs)

    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 3
    for apart in (False, True):
        target.capabilities = dataclasses.replace(target.capabilities, prompt_pass_apart=apart)
        asked.clear()
        Engine(target, NgramFactory(4, 1)).generate(prompt, controller=Spy(2), stop=StopConfig(max_tokens=12)).run()
        # only the step whose pass finishes the prompt, and only on such a runtime
        assert len(asked) >= 2 and asked == [apart] + [False] * (len(asked) - 1)
