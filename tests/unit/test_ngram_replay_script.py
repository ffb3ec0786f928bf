"""scripts/ngram_replay.py: replaying a known output through n-gram lookup counts passes and seconds
the way the engine would spend them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from spekula.control import AdaptiveK, CostModel, FixedK

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("ngram_replay", SCRIPTS / "ngram_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.replay


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
