"""Shadow drafts (spekula.shadow): a free proposer's draft at a plain step, scored by the tokens emitted after it,
teaches the controller without a verify pass and without touching the output."""

import torch

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.control import AdaptiveK
from spekula.cost import CostModel, base_acceptance
from spekula.engine import Engine
from spekula.proposers import DraftModelFactory, NgramFactory
from spekula.proposers.suffix import SuffixFactory, match_class
from spekula.shadow import SHADOW_MIN_MATCH, ShadowDraft
from spekula.testing import FunctionBackend, random_table_backend
from spekula.trace import ListTrace

from costkit import compute_bound, llamacpp_avx512


def test_a_shadow_settles_at_its_first_differing_token_or_when_every_token_matched():
    shadow = ShadowDraft([5, 6, 7, 8], match_class(4), 10)
    assert not shadow.feed([5]) and shadow.accepted == 1  # one plain step's token
    assert shadow.feed([6, 9, 7]) and shadow.accepted == 2  # a verify step's tokens: 9 differs from 7
    assert shadow.feed([7, 8]) and shadow.accepted == 2  # settled: later tokens change nothing
    whole = ShadowDraft([1, 2], None, 3)
    assert whole.feed([1, 2, 3]) and whole.accepted == 2
    assert whole.to_dict() == {"position": 3, "draft_class": None, "tokens": [1, 2], "drafted": 2, "accepted": 2}
    assert ShadowDraft([4], match_class(1), 0).feed([3])


def test_shadows_that_pass_make_a_class_the_prior_would_not_try_pay():
    costs = llamacpp_avx512()
    ctl = AdaptiveK(costs, k_max=16)
    assert ctl.choose_k(100, 0, match_class(2)) == 0  # its match length alone does not pay: not even a probe
    assert ctl.reason.startswith("plain")
    for _ in range(3):  # the target went on to emit what the suffix match would have drafted
        ctl.observe_shadow(3, 3, match_class(2))
    assert ctl.choose_k(100, 0, match_class(2)) >= 2 and ctl.reason.startswith("speculate")
    # the engine-wide rates of the class learnt it too (slowly, one request's n-th draft of a class counting 1/n):
    # a new request starts from them
    assert costs.prior_acceptance(match_class(2))[0] > base_acceptance(match_class(2))[0] + 0.05
    failing = AdaptiveK(llamacpp_avx512(), k_max=16)
    for _ in range(3):
        failing.observe_shadow(3, 0, match_class(2))
    assert failing.choose_k(100, 0, match_class(2)) == 0 and failing.acceptance(match_class(2))[0] < 0.3


V = 48
LINES = [[8 + (5 * i + j) % 40 for j in range(24)] for i in range(4)]
PROMPT = [1, *[t for line in LINES for t in [*line, 2]]]
# the answer re-emits the prompt's lines, each with its first token changed (as an edit that reformats)
SCRIPT = [t for i, line in enumerate(LINES) for t in [3 + i, *line[1:], 2]]


def copying_target() -> FunctionBackend:
    def logits_fn(prefix: list[int]) -> torch.Tensor:
        row = torch.zeros(V)
        i = len(prefix) - len(PROMPT)
        row[SCRIPT[i] if 0 <= i < len(SCRIPT) else 0] = 4.0
        return row

    return FunctionBackend(logits_fn, V)


def test_shadows_are_scored_against_what_the_target_emitted_and_leave_the_output_alone():
    target = copying_target()
    stop = StopConfig(max_tokens=len(SCRIPT))
    plain = Engine(target).generate(PROMPT, SamplingParams(), stop).run()
    assert plain.token_ids == SCRIPT
    outcomes = set()
    for factory in (SuffixFactory(), NgramFactory(4, 1)):
        engine = Engine(target, factory, SpecConfig(k=None, k_max=16, shadow_drafts=True))
        engine.costs = compute_bound()  # no draft pays here, so every step is plain: shadows all along
        trace = ListTrace()
        g = engine.generate(PROMPT, SamplingParams(), stop, trace).run()
        assert g.token_ids == plain.token_ids
        shadows = [r.shadow for r in trace.steps if r.shadow is not None]
        assert shadows, "plain steps with a match in hand open shadow drafts"
        text = PROMPT + SCRIPT
        for shadow in shadows:  # each scored as verification would have: its prefix the target went on to emit
            tokens, at = shadow["tokens"], shadow["position"]
            matched = next((i for i, t in enumerate(tokens) if text[at + i] != t), len(tokens))
            assert shadow["accepted"] == matched and shadow["drafted"] == len(tokens) > 0
            opened = next(r for r in trace.steps if r.position == at)
            assert opened.k == 0 and str(opened.draft_class) == shadow["draft_class"]  # opened at a plain step
            assert opened.draft_class.length >= SHADOW_MIN_MATCH  # after a long match only
            outcomes.add(shadow["accepted"] == shadow["drafted"])
    assert outcomes == {True, False}  # both kinds settled: a draft the target followed, one it did not


def test_no_shadow_unless_the_spec_turns_them_on():
    assert SpecConfig().shadow_drafts is False
    engine = Engine(copying_target(), SuffixFactory(), SpecConfig(k=None, k_max=16))
    engine.costs = compute_bound()  # every step plain, as where shadows are kept when on
    trace = ListTrace()
    engine.generate(PROMPT, SamplingParams(), StopConfig(max_tokens=len(SCRIPT)), trace).run()
    long_matches = [r for r in trace.steps if r.k == 0 and (r.draft_class.length or 0) >= SHADOW_MIN_MATCH]
    assert long_matches  # plain steps with a long match in hand ...
    assert all(r.shadow is None for r in trace.steps)  # ... and not one shadow


def test_a_draft_model_is_never_asked_for_a_shadow():
    target = random_table_backend(40, seed=0, order=2)
    draft = random_table_backend(40, seed=99, order=2)  # a poor draft: mostly plain steps
    engine = Engine(target, DraftModelFactory(draft), SpecConfig(k=None, k_max=6, shadow_drafts=True))
    engine.costs = llamacpp_avx512()
    trace = ListTrace()
    draft.passes = 0
    g = engine.generate([1, 2, 3], SamplingParams(), StopConfig(max_tokens=40), trace).run()
    assert g.stats.k_chosen.get(0, 0) > 0  # there were plain steps ...
    assert all(r.shadow is None for r in trace.steps)  # ... and none of them drafted in the shadows
    assert draft.passes <= 1 + sum(r.k for r in trace.steps)  # the draft ran only for what was verified


def test_only_a_shadow_as_long_as_the_slow_start_cap_doubles_it():
    ctl = AdaptiveK(llamacpp_avx512(), k_max=16)
    cap = ctl.k_cap
    for _ in range(4):  # short matching shadows: common in prose, no proof that a long draft would pass
        ctl.observe_shadow(1, 1, match_class(1))
    assert ctl.k_cap == cap
    ctl.observe_shadow(cap, cap, match_class(4))
    assert ctl.k_cap == min(2 * (cap + 1) - 1, 16)  # twice the rows


def test_shadow_evidence_leaves_a_request_its_first_probe():
    # shadows that failed make drafting look bad; a request that has verified nothing still probes at its
    # first draft whose match length alone would pay, as a new request does (control.AdaptiveK._probe_due)
    ctl = AdaptiveK(llamacpp_avx512(), k_max=16)
    for _ in range(8):
        ctl.observe_shadow(16, 0, match_class(16))
    assert ctl.choose_k(100, 0, match_class(16)) == 1 and ctl.reason.startswith("probe")
    assert ctl.choose_k(100, 0, match_class(16)) == 0  # one probe, then the clock: the shadows were evidence


def test_shadows_are_for_the_cold_start_only():
    ctl = AdaptiveK(llamacpp_avx512(), k_max=16)
    assert ctl.wants_shadows
    ctl.observe_shadow(5, 5, match_class(4))
    assert ctl.wants_shadows  # watching is not verifying
    ctl.observe(2, 2, 1, 0.0, 0.062, 0, match_class(4))
    assert not ctl.wants_shadows  # its own verified drafts teach it from now on
    engine = Engine(copying_target(), SuffixFactory(), SpecConfig(k=None, k_max=16, shadow_drafts=True))
    # a 2-row pass 1.8x a 1-row one, each row after 0.8x: a 4-token match alone does not pay, proven copying does
    engine.costs = CostModel(target_s={n: 0.033 * (1 + 0.8 * (n - 1)) for n in range(1, 18)}, frozen=True)
    trace = ListTrace()
    engine.generate(PROMPT, SamplingParams(), StopConfig(max_tokens=len(SCRIPT)), trace).run()
    first_verified = next(r.position for r in trace.steps if r.drafted)
    assert any(r.shadow is not None for r in trace.steps)  # the cold start had them
    assert all(r.shadow["position"] < first_verified for r in trace.steps if r.shadow is not None)
