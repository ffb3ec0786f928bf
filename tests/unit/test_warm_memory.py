"""A warm server replayed: memory of earlier answers helps some requests and misleads others (issue 34, item 3).

Greedy output does not depend on what is drafted, so what a model-free proposer offers at each output position,
and how much of it the output agrees with, is a property of the text alone: a request is replayed as that list
(At), the controller chooses k at each step it reaches, and the step costs a pass of the drafted width at a
fixed cost table. One engine (one CostModel) serves the whole sequence, as a server that has been running does.
"""

import copy
from dataclasses import dataclass, field

import pytest

from spekula.control import SLOW_START_PASSES, AdaptiveK
from spekula.cost import CostModel
from spekula.draft_class import NO_DRAFT, RECALLED, DraftClass
from spekula.proposers.suffix import match_class

from costkit import llamacpp_avx512, llamacpp_issue14

TOKENS = 96  # per request, as the issue's warm-server check


@dataclass(frozen=True)
class At:
    """What the proposer offers at one output position."""

    draft_class: DraftClass
    offered: int = 0  # continuation tokens it would draft if asked for that many
    right: int = 0  # how many of them, from the first, the output agrees with


@dataclass
class Replay:
    seconds: float = 0.0
    passes: int = 0
    drafted: dict[str, int] = field(default_factory=dict)  # memory's drafts (RECALLED) and the request's own
    accepted: dict[str, int] = field(default_factory=dict)


def replay(costs: CostModel, text: list[At]) -> Replay:
    """One request through a fresh AdaptiveK on the engine's shared cost model."""
    ctl, out, done = AdaptiveK(costs), Replay(), 0
    while done < len(text):
        at = text[done]
        k = min(ctl.choose_k(len(text) - done, 0, at.draft_class), len(text) - done - 1)
        drafted = 0 if at.draft_class == NO_DRAFT else min(k, at.offered)
        accepted = min(drafted, at.right)
        ctl.observe(k, drafted, accepted, 0.0, costs.target_cost(drafted + 1), 0, at.draft_class)
        source = RECALLED if at.draft_class.source == RECALLED else "own text"
        out.drafted[source] = out.drafted.get(source, 0) + drafted
        out.accepted[source] = out.accepted.get(source, 0) + accepted
        out.seconds += costs.target_cost(drafted + 1)
        out.passes += 1
        done += accepted + 1
    return out


def second_turn(edit_every: int = 40) -> list[At]:
    """A request whose answer re-emits an earlier answer held in memory (not in its prompt), with an edit every
    edit_every tokens: memory's match grows with every token copied, and is right up to the next edit."""
    text = []
    for i in range(TOKENS):
        copied = i % edit_every  # tokens matched since the last edit
        to_edit = edit_every - 1 - copied  # the last token of a stretch is the edit
        text.append(At(match_class(copied, RECALLED), min(copied, 16), to_edit) if copied else At(NO_DRAFT))
    return text


def new_answer() -> list[At]:
    """A new chat answer: memory matches earlier answers' phrases, long and short, and goes on with theirs; the
    request's own text matches a little and is right now and then."""
    cycle = [
        At(match_class(8, RECALLED), 8, 0),
        At(NO_DRAFT),
        At(match_class(4, RECALLED), 4, 0),
        At(match_class(2), 2, 1),
        At(match_class(16, RECALLED), 16, 0),
        At(match_class(1), 1, 0),
    ]
    return [cycle[i % len(cycle)] for i in range(TOKENS)]


def code_answer() -> list[At]:
    """An answer that copies its own prompt (the request's own text, right for ten tokens at a time) between
    stretches where memory matches other requests' code and is wrong."""
    return [
        At(match_class(16), 16, 9 - i % 20) if i % 20 < 10 else At(match_class(8, RECALLED), 8, 0)
        for i in range(TOKENS)
    ]


WARM = ["turn2"] * 3 + ["new", "turn2", "code", "new", "turn2", "new", "code", "new", "turn2", "new"]
TEXTS = {"turn2": second_turn, "new": new_answer, "code": code_answer}


def without_memory(text: list[At]) -> list[At]:
    """The same request on a server that remembers nothing: memory's offers gone."""
    return [At(NO_DRAFT) if at.draft_class.source == RECALLED else at for at in text]


@dataclass
class Run:
    kind: str
    replay: Replay
    forgetful: Replay  # the same request, on the same engine at that point, with no memory of earlier requests
    plain: float  # plain decoding's seconds


@pytest.fixture(params=[llamacpp_avx512, llamacpp_issue14], ids=["avx512", "issue14"])
def runs(request) -> list[Run]:
    """The warm sequence on one engine."""
    costs = request.param()
    out = []
    for kind in WARM:
        text = TEXTS[kind]()
        forgetful = replay(copy.deepcopy(costs), without_memory(text))
        out.append(Run(kind, replay(costs, text), forgetful, len(text) * costs.target_cost(1)))
    return out


def finding_out(run: Run) -> float:
    """What a request may spend to find out that memory misleads it: one draft at slow start (a fully
    rejected one costs at most SLOW_START_PASSES plain passes), and probes (at most probe_budget of plain
    decoding's time)."""
    return SLOW_START_PASSES * run.plain / TOKENS + AdaptiveK.probe_budget * run.plain


def test_memory_that_misleads_a_new_answer_leaves_it_no_slower_than_plain_decoding(runs):
    for run in runs:
        if run.kind == "new":
            assert run.replay.seconds <= run.plain + finding_out(run)


def test_memory_that_misleads_costs_a_request_no_more_than_finding_out(runs):
    # whatever the request's own text does: a request whose own text copies (code) does not lend that to memory
    misled = [run for run in runs if run.kind in ("new", "code")]
    assert any(run.forgetful.seconds < 0.8 * run.plain for run in misled)  # some are fast on their own
    for run in misled:
        assert run.replay.seconds <= run.forgetful.seconds + finding_out(run)


def test_memory_that_helps_still_drafts_and_wins_after_requests_it_misled(runs):
    turns = [run for run in runs if run.kind == "turn2"]
    assert all(run.replay.drafted[RECALLED] > TOKENS / 2 for run in turns)
    ratios = [run.replay.seconds / run.plain for run in turns]
    assert max(ratios) < 0.7  # memory's drafts pass: far fewer passes than plain decoding
    assert max(ratios[3:]) <= 1.05 * max(ratios[:3])  # the misled requests in between poisoned nothing
