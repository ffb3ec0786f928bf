"""scripts/experiments/ngram_replay.py: replaying a known output through n-gram lookup counts passes and
seconds the way the engine would spend them. The script is an experiment; this test keeps it runnable
because docstrings in src/ cite it as where acceptance by draft class is measured."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from spekula.control import AdaptiveK, FixedK
from spekula.cost import CostModel

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "ngram_replay.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("ngram_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def replay(script):
    return script.replay


def costs() -> CostModel:
    return CostModel(target_s={1: 1.0, 9: 2.0}, frozen=True)


def test_an_output_that_copies_the_prompt_takes_one_pass(replay):
    prompt = [42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 42]
    output = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # what followed the prompt's last token, 42, where it came first
    seconds, passes = replay(prompt, output, FixedK(8), costs(), 4, 1)
    assert passes == 1 and seconds == pytest.approx(2.0)  # 8 drafts accepted + the bonus token, one 9-wide pass


def test_an_output_the_prompt_never_predicts_costs_plain_passes(replay):
    prompt = [1, 2, 3]
    output = [10, 11, 12, 13]  # no n-gram of the output occurs earlier: nothing is drafted
    seconds, passes = replay(prompt, output, FixedK(8), costs(), 4, 1)
    assert passes == 4 and seconds == pytest.approx(4.0)
    seconds, passes = replay(prompt, output, AdaptiveK(costs()), costs(), 4, 1)
    assert passes == 4 and seconds == pytest.approx(4.0)


def test_acceptance_is_counted_by_draft_class_and_position(script):
    prompt = [7, 1, 2, 3, 4, 5, 6, 7]
    output = [1, 2, 9]  # copies the prompt after its 1-token match on 7, then leaves it
    counts: dict = {}
    script.acceptance_by_class(prompt, output, 8, 4, 1, counts)
    # position 0: "1-gram" (7) drafts 1, 2, 3: two accepted, the third reached and rejected;
    # position 1: "2-gram" (7, 1) drafts 2, 3: one accepted, then rejected; position 2: "3-gram" drafts 3: rejected.
    assert counts["1-gram"][:3] == [[1, 1], [1, 1], [0, 1]]
    assert counts["2-gram"][:2] == [[1, 1], [0, 1]]
    assert counts["3-gram"][0] == [0, 1]
