"""scripts/experiments/ngram_replay.py: replaying a known output through the engine with a model-free proposer
counts the passes and seconds the engine spends, and the two oracles' figures are the ones computed by hand.
The script is an experiment; this test keeps it runnable because docstrings in src/ cite it as where
acceptance by draft class is measured, and docs/BENCHMARKS.md as where the oracle comparison is."""

from __future__ import annotations

import pytest

from spekula.config import SpecConfig
from spekula.control import FixedK
from spekula.cost import CostModel
from spekula.draft_class import ngram_class

from scriptkit import loaded

VOCAB, EOS = 64, 63


@pytest.fixture(scope="module")
def script():
    with loaded("experiments/ngram_replay.py") as module:
        yield module


def linear_costs() -> dict[int, float]:
    """A pass of n tokens costs 1 + 0.5 (n - 1) seconds (interpolated between the two widths given)."""
    return {1: 1.0, 9: 5.0}


def engine(script, table: dict[int, float], draft: str = "ngram"):
    costs = CostModel(target_s=dict(table), frozen=True)
    return script.replay_engine(draft, SpecConfig(k=None), costs, script.ReplayBackend(VOCAB, EOS))


def test_an_output_that_copies_the_prompt_takes_one_pass(script):
    request = script.Request("p", "c", [42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 42], [1, 2, 3, 4, 5, 6, 7, 8, 9])
    # what followed the prompt's last token, 42, where it came first: 8 drafts accepted + the bonus, one 9-wide pass
    replayed = script.replay(engine(script, {1: 1.0, 9: 2.0}), request, FixedK(8))
    assert replayed.passes == 1 and replayed.seconds == pytest.approx(2.0)


def test_an_output_the_prompt_never_predicts_costs_plain_passes(script):
    request = script.Request("p", "c", [1, 2, 3], [10, 11, 12, 13])  # no n-gram of the output occurs earlier
    for controller in (FixedK(8), None):  # None: the engine's own controller (k=auto)
        replayed = script.replay(engine(script, linear_costs()), request, controller)
        assert replayed.passes == 4 and replayed.seconds == pytest.approx(4.0)


def test_the_oracles_figures_are_the_hand_computed_ones(script):
    # T(n) = 1 + 0.5 (n - 1). The prompt's "7" is followed by 1 2 3 4; the output copies 1 2 3, then leaves.
    request = script.Request("p", "c", [7, 1, 2, 3, 4, 7], [1, 2, 3, 9, 9])
    table = linear_costs()
    results = script.compare(
        [request], ["ngram"], ["auto", "oracle", "perfect"], table, SpecConfig(k=None), (VOCAB, EOS)
    )
    runs = {p: results["ngram"][p]["p"] for p in ("auto", "oracle", "perfect")}
    # oracle: drafts 1 2 3 4 (k = 4, the budget's cap): 3 accepted + the recovered 9, a 5-wide pass (3 s); then
    # the last 9 has no match, a plain pass (1 s).
    assert (runs["oracle"].passes, runs["oracle"].seconds) == (2, pytest.approx(4.0))
    # perfect: knows only 1 2 3 pass, so drafts those three: a 4-wide pass (2.5 s), then the plain pass (1 s).
    assert (runs["perfect"].passes, runs["perfect"].seconds) == (2, pytest.approx(3.5))
    assert script.speedup(request, runs["perfect"], table) == pytest.approx(5 / 3.5)
    # no controller drafting from this proposer beats the perfect one
    assert runs["auto"].seconds >= runs["perfect"].seconds - 1e-9


def test_a_stop_token_costs_a_pass_and_the_budget_is_the_requests(script):
    request = script.Request("p", "c", [5, 6], [1, 2, 3], stopped=True, max_tokens=10)
    replayed = script.replay(engine(script, linear_costs()), request, FixedK(0))
    assert request.emitted == 4 and replayed.passes == 4  # 1, 2, 3, then the stop token
    results = script.compare([request], ["ngram"], ["perfect"], linear_costs(), SpecConfig(k=None), (VOCAB, EOS))
    assert results["ngram"]["perfect"]["p"].passes == 4  # nothing to draft from: plain passes


def test_suffix_drafts_from_earlier_requests_outputs_in_the_run_order(script):
    first = script.Request("a", "c", [1, 2], [10, 11, 12, 13, 14, 15, 16, 17])
    second = script.Request("b", "c", [3, 10], [11, 12, 13, 14, 15, 16, 17])  # repeats the first's output
    results = script.compare(
        [first, second], ["suffix", "ngram"], ["oracle", "perfect"], linear_costs(), SpecConfig(k=None), (VOCAB, EOS)
    )
    for policy in ("oracle", "perfect"):
        assert results["suffix"][policy]["a"].passes == 8  # nothing seen before: plain passes
        assert results["suffix"][policy]["b"].passes < 7  # drafted from the first request's output
        assert results["ngram"][policy]["b"].passes == 7  # n-gram lookup has no memory across requests


def test_the_category_figures_are_medians_and_the_ratio_is_of_the_medians(script):
    table = {1: 1.0}
    requests = [script.Request(i, "c", [1], [2] * 4) for i in ("x", "y")]
    runs = {
        "auto": {"x": script.Replayed(2.0, 2), "y": script.Replayed(4.0, 4)},  # 2x, 1x
        "oracle": {"x": script.Replayed(1.0, 1), "y": script.Replayed(2.0, 2)},  # 4x, 2x
    }
    assert script.medians(runs, requests, table) == {
        "c": {"auto": 1.5, "oracle": 3.0},
        "all": {"auto": 1.5, "oracle": 3.0},
    }
    lines = script.report({"ngram": runs}, requests, table)
    assert "c | 1.500x | 3.000x | 50%" in lines


def test_acceptance_is_counted_by_draft_class_and_position(script):
    prompt = [7, 1, 2, 3, 4, 5, 6, 7]
    output = [1, 2, 9]  # copies the prompt after its 1-token match on 7, then leaves it
    counts: dict = {}
    script.acceptance_by_class(prompt, output, 8, 4, 1, counts)
    # position 0: "1-gram" (7) drafts 1, 2, 3: two accepted, the third reached and rejected;
    # position 1: "2-gram" (7, 1) drafts 2, 3: one accepted, then rejected; position 2: "3-gram" drafts 3: rejected.
    assert counts[ngram_class(1)][:3] == [[1, 1], [1, 1], [0, 1]]
    assert counts[ngram_class(2)][:2] == [[1, 1], [0, 1]]
    assert counts[ngram_class(3)][0] == [0, 1]


def test_a_shorter_max_tokens_cuts_the_output_and_a_stop_after_the_cut_is_not_reached(script):
    stopped = script.Request("s", "c", [1], [2, 3, 4], stopped=True, max_tokens=256)
    cut = script.Request("l", "c", [1], [2, 3, 4, 5, 6])
    # stopped before the cap: the same output and stop, budget the cap
    short = script.truncated(stopped, 4)
    assert (short.output, short.stopped, short.budget, short.emitted) == ([2, 3, 4], True, 4, 4)
    # the stop token would come at the cap's position, which a run with max_tokens 3 never reaches
    at_cap = script.truncated(stopped, 3)
    assert (at_cap.output, at_cap.stopped, at_cap.budget, at_cap.emitted) == ([2, 3, 4], False, 3, 3)
    longer = script.truncated(cut, 2)
    assert (longer.output, longer.stopped, longer.budget, longer.emitted) == ([2, 3], False, 2, 2)
    # and the replay runs it: one pass a token when nothing is drafted
    replayed = script.replay(engine(script, linear_costs()), longer, FixedK(0))
    assert replayed.passes == 2
