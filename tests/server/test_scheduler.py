"""The scheduler without HTTP: every request runs plan -> score -> complete, alone or in a batch, and
is finished in the round in which it finishes.

Jobs are submitted before the worker starts, so the first round admits them all; every event is
tagged with the round the worker was in when it sent it. close() returns once every job has
finished and the worker has stopped, so nothing here waits on time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from spekula.cli import build_parser
from spekula.config import SamplingParams, StopConfig
from spekula.cost import CostModel
from spekula.engine import Generation
from spekula.errors import ConfigError
from spekula.server.app import create_app
from spekula.server.cli import settings_from_args
from spekula.server.metrics import ServerMetrics
from spekula.server.scheduler import Delta, Event, Finished, Job, Scheduler
from spekula.server.schemas import Speculation
from spekula.server.settings import ServerSettings

from serverkit import fake_pipeline, native_pipeline, serving

WAIT = 20.0  # seconds close() may take before the test fails


@dataclass
class Request:
    prompt: str
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    spec: Speculation | None = None  # what the request's `spec` chose (None: the server's own)

    @property
    def stop_config(self) -> StopConfig:
        return StopConfig(max_tokens=self.max_tokens, stop=self.stop, ignore_eos=self.ignore_eos)


@dataclass
class Outcome:
    events: list[tuple[int, Event]]  # (round, event), in the order the sink got them

    @property
    def finished(self) -> Finished:
        last = self.events[-1][1]
        assert isinstance(last, Finished), last
        return last

    @property
    def finished_round(self) -> int:
        return self.events[-1][0]

    @property
    def text(self) -> str:
        return "".join(e.text for _, e in self.events if isinstance(e, Delta))


def run(pipe, requests: list[Request], scheduler: Scheduler | None = None, **options) -> list[Outcome]:
    """options: for the Scheduler (e.g. prefill_chunk)."""
    scheduler = scheduler or Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16, **options)
    outcomes = [Outcome([]) for _ in requests]
    for i, r in enumerate(requests):
        sink = outcomes[i].events.append
        ids = pipe.codec.encode(r.prompt)
        job = Job(
            f"job-{i}",
            ids,
            r.sampling,
            r.stop_config,
            lambda e, sink=sink: sink((scheduler.rounds, e)),
            WAIT,
            spec=r.spec,
        )
        scheduler.submit(job)
    scheduler.start()
    assert scheduler.close(WAIT)
    return outcomes


PIPELINES = {
    "one-after-another": lambda k: fake_pipeline(draft="other", k=k),  # a backend that does not batch
    "batched": lambda k: native_pipeline(k=k, draft="other"),  # the native runner: one forward per round
}


@pytest.mark.parametrize("kind", PIPELINES)
def test_a_lone_request_runs_the_same_steps_as_in_a_batch(kind, monkeypatch):
    """Alone or beside another request, a request takes the same steps and gives the same text;
    greedy, that text is plain decoding's. None of it goes through the generator path."""
    pipe = PIPELINES[kind](3)
    greedy = Request("lone or not: ", 24)
    sampled = Request("company", 30, SamplingParams(temperature=0.9, seed=5))
    ids = pipe.codec.encode(greedy.prompt)
    plain = pipe.generate(ids, SamplingParams(), StopConfig(max_tokens=24), plain=True).text

    def unused(self):
        raise AssertionError("the scheduler stepped a request through the generator path")
        yield

    monkeypatch.setattr(Generation, "_run", unused)
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16)
    (alone,) = run(pipe, [greedy], scheduler)
    (sampled_alone,) = run(pipe, [sampled])
    together = run(pipe, [greedy, sampled])

    assert alone.text == alone.finished.text == plain
    for lone, paired in ((alone, together[0]), (sampled_alone, together[1])):
        a, b = lone.finished.stats, paired.finished.stats
        assert paired.text == lone.text and paired.finished.finish_reason == lone.finished.finish_reason == "length"
        steps = [(s.target_passes, s.k_chosen, s.drafted, s.accepted) for s in (a, b)]
        assert steps[0] == steps[1]
    assert alone.finished_round == alone.finished.stats.target_passes == scheduler.rounds  # one step per round
    if kind == "batched":  # the lone request's passes were batches of one
        registry = scheduler.metrics.registry
        assert registry.get_sample_value("spekula_batch_size_count") == scheduler.rounds
        assert registry.get_sample_value("spekula_batch_size_sum") == scheduler.rounds


def test_a_seeded_request_gives_the_same_text_alone_batched_and_plain():
    """A seed fixes the sample (spekula.noise): through the batching native runner, the same seeded request gives
    plain decoding's text alone at k=3, beside other requests, under --k auto's batch rule, and with its own
    `spec` plain in a batch."""
    seeded = Request("seeded: ", 32, SamplingParams(temperature=1.0, seed=9), ignore_eos=True)
    plain_spec = Request(seeded.prompt, 32, seeded.sampling, ignore_eos=True, spec=Speculation("none", 0, 32))
    neighbours = [Request("a greedy neighbour", 32), Request("a sampled one", 32, SamplingParams(temperature=1.0))]
    fixed = native_pipeline(k=3, draft="other")
    plain = fixed.generate(fixed.codec.encode(seeded.prompt), seeded.sampling, seeded.stop_config, plain=True)

    (alone,) = run(fixed, [seeded])
    batched = run(fixed, [neighbours[0], seeded, neighbours[1]])[1]
    plain_batched = run(fixed, [plain_spec, *neighbours])[0]
    auto = native_pipeline(k=None, draft="self")
    scheduler = Scheduler(auto, ServerMetrics(), max_running=8, max_queue=16)  # calibrates; then costs that pay
    auto.engine.costs = CostModel(target_s={n: 0.002 for n in range(1, 150)}, draft_s_per_token=0.0002, frozen=True)
    auto_batched = run(auto, [seeded, *neighbours], scheduler)[0]

    for outcome in (alone, batched, plain_batched, auto_batched):
        assert outcome.text == plain.text and outcome.finished.stats.output_tokens == 32
    assert alone.finished.stats.drafted > 0 and auto_batched.finished.stats.accepted > 0  # verified drafts
    assert plain_batched.finished.stats.drafted == 0


@pytest.mark.parametrize("kind", PIPELINES)
def test_a_request_is_finished_in_the_round_it_finishes(kind):
    """Its last text and its end go out in the round of its last step, before the next round: the
    short request's Finished is tagged with the round of its last target pass while the long one runs on.
    (The random native model may end the short one with its end-of-sequence token: the same holds.)"""
    pipe = PIPELINES[kind](4)
    requests = [Request("short", 6), Request("and a long one", 40, ignore_eos=True)]
    short, long = run(pipe, requests)
    for outcome, request in zip((short, long), requests, strict=True):
        ids = pipe.codec.encode(request.prompt)
        plain = pipe.generate(ids, request.sampling, request.stop_config, plain=True)
        stats = outcome.finished.stats
        assert outcome.text == plain.text and outcome.finished.finish_reason == plain.finish_reason
        assert stats.output_tokens == len(plain.token_ids)
        assert outcome.finished_round == stats.target_passes  # admitted in round 1, one step per round
    assert long.finished.stats.output_tokens == 40
    assert short.finished_round < long.finished_round  # the other request kept running after it


@pytest.mark.parametrize("kind", PIPELINES)
def test_a_stop_string_or_a_full_context_ends_the_request_in_that_round(kind):
    """The other ends: a stop string (found by the text layer) and a context that has no room for
    another token (found by the engine in complete(), not by the next plan()). Whole prompts, so the
    long one is prefilled in round 1 (chunked prefill: tests/server/test_prefill_chunks.py)."""
    pipe = PIPELINES[kind](4)
    full = pipe.generate(pipe.codec.encode("stop here"), SamplingParams(), StopConfig(max_tokens=40), plain=True).text
    stop = full[12:14]
    context = pipe.target.context_length
    crowded = "x" * (context - 10)  # room for 10 tokens; max_tokens asks for more
    stopped, filled = run(pipe, [Request("stop here", 40, stop=(stop,)), Request(crowded, 100)], prefill_chunk=0)
    assert stopped.text == stopped.finished.text == full[: full.index(stop)]
    assert stopped.finished.finish_reason == "stop" and stopped.finished_round == stopped.finished.stats.target_passes
    assert filled.finished.finish_reason == "length" and filled.finished.stats.output_tokens == 10
    assert filled.finished_round == filled.finished.stats.target_passes


def test_a_batch_of_one_lets_the_request_s_own_controller_choose_k(monkeypatch):
    """--k auto on a batching backend: alone, a request's k comes from its own controller, exactly as
    through the pipeline; the scheduler imposes a round's k (the batch rule) only on two or more."""
    pipe = native_pipeline(k=None, draft="self")
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16)  # calibrates the batch widths

    def frozen() -> CostModel:  # the same costs for every run: measured ones would depend on the machine's load
        return CostModel(target_s={n: 0.002 for n in range(1, 18)}, draft_s_per_token=0.0005, frozen=True)

    request = Request("auto k: ", 40)
    pipe.engine.costs = frozen()
    reference = pipe.generate(pipe.codec.encode(request.prompt), SamplingParams(), request.stop_config)

    imposed: list[int | None] = []  # the k the scheduler gave each plan() (None: the request's controller chooses)
    plan = Generation.plan
    monkeypatch.setattr(Generation, "plan", lambda self, k=None, why=None: imposed.append(k) or plan(self, k, why))
    pipe.engine.costs = frozen()
    (alone,) = run(pipe, [request], scheduler)
    stats = alone.finished.stats
    assert alone.text == reference.text
    assert (stats.k_chosen, stats.target_passes) == (reference.stats.k_chosen, reference.stats.target_passes)
    assert max(stats.k_chosen) > 0 and imposed == [None] * stats.target_passes

    imposed.clear()
    run(pipe, [request, Request("a second one", 40)])
    assert imposed and all(k is not None for k in imposed[:2])  # round 1 of two requests: the batch rule's k


def test_in_a_batch_each_request_gets_the_k_its_own_outlook_pays_for(monkeypatch):
    """--k auto, batched: the scheduler asks every decoding request what it expects of its next draft
    (Generation.outlook) and chooses their ks together (CostModel.best_ks). On a compute-bound cost
    curve a request whose drafts are accepted drafts beside one whose drafts fail, which decodes plainly, where
    the round's ks are chosen for throughput alone (--spec-max-slowdown 1)."""
    pipe = native_pipeline(k=None, draft="self")
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16, spec_max_slowdown=1.0)
    rows = {1: 0.05, 2: 0.09, 4: 0.12, 8: 0.34, 16: 0.39, 17: 0.55, 32: 0.8, 64: 1.6, 144: 3.6}  # llama.cpp-like
    pipe.engine.costs = CostModel(target_s=rows, frozen=True)
    copying = pipe.codec.encode("copy me: ")
    monkeypatch.setattr(Generation, "outlook", lambda self: ([1.0], 8) if self.prompt_ids == copying else ([0.0], 8))
    imposed: dict[bool, list[int | None]] = {True: [], False: []}
    plan = Generation.plan
    monkeypatch.setattr(
        Generation,
        "plan",
        lambda self, k=None, why=None: imposed[self.prompt_ids == copying].append(k) or plan(self, k, why),
    )
    run(pipe, [Request("copy me: ", 24), Request("not me", 24)], scheduler)
    rounds = min(len(imposed[True]), len(imposed[False]))
    assert rounds >= 2
    assert all(k is not None and k > 0 for k in imposed[True][:rounds])  # while both run: it drafts
    assert imposed[False][:rounds] == [0] * rounds  # and the other does not


def test_by_default_a_request_that_copies_does_not_slow_one_that_cannot(monkeypatch):
    """The default --spec-max-slowdown: while a request whose drafts fail decodes beside it, one whose drafts
    would all be accepted drafts nothing (its rows would lengthen the other's rounds by more than the bound),
    though with no bound it drafts there (test_in_a_batch_each_request_gets_the_k_its_own_outlook_pays_for);
    alone again, its own controller chooses. Two requests that both copy draft together. The texts stay plain
    decoding's."""
    pipe = native_pipeline(k=None, draft="self")
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16)
    assert scheduler.spec_max_slowdown == ServerSettings().spec_max_slowdown < 1
    rows = {1: 0.05, 2: 0.09, 4: 0.12, 8: 0.34, 16: 0.39, 17: 0.55, 32: 0.8, 64: 1.6, 144: 3.6}  # llama.cpp-like
    pipe.engine.costs = CostModel(target_s=rows, frozen=True)
    copying = [pipe.codec.encode(p) for p in ("copy me: ", "copy me too: ")]
    monkeypatch.setattr(Generation, "outlook", lambda self: ([1.0], 8) if self.prompt_ids in copying else ([0.0], 8))
    imposed: dict[str, list[int | None]] = {}
    reasons: list[str | None] = []
    plan = Generation.plan
    monkeypatch.setattr(
        Generation,
        "plan",
        lambda self, k=None, why=None: (
            imposed.setdefault(pipe.codec.decode(self.prompt_ids), []).append(k)
            or reasons.append(why)
            or plan(self, k, why)
        ),
    )
    requests = [Request("copy me: ", 40), Request("not me", 6)]
    outcomes = run(pipe, requests, scheduler)
    rounds = len(imposed["not me"])  # the short one's rounds: both decoding
    assert rounds >= 2 and imposed["copy me: "][:rounds] == imposed["not me"] == [0] * rounds
    held = "a draft would slow another request by more than --spec-max-slowdown 0.02"  # the step records say why
    assert reasons[: 2 * rounds] == [held] * (2 * rounds)
    assert len(imposed["copy me: "]) > rounds and imposed["copy me: "][rounds] is None  # alone: its own controller
    for r, outcome in zip(requests, outcomes, strict=True):
        alone = pipe.generate(pipe.codec.encode(r.prompt), SamplingParams(), r.stop_config, plain=True)
        assert outcome.text == alone.text
    imposed.clear()
    run(
        pipe,
        [Request("copy me: ", 24), Request("copy me too: ", 24)],
        Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16),
    )
    both = min(len(imposed["copy me: "]), len(imposed["copy me too: "]))
    assert both >= 2 and all(k is not None and k > 0 for name in imposed for k in imposed[name][:both])


def test_above_spec_disable_by_batch_size_no_request_drafts(monkeypatch):
    """--spec-disable-by-batch-size 1: while two requests decode, neither drafts, not even the one whose drafts
    would be accepted (the round its rows would lengthen is the other request's too), and the scheduler says
    why (the reason plan() is given for its step record); alone again, its own controller chooses its k and it
    drafts. The texts stay plain decoding's."""
    pipe = native_pipeline(k=None, draft="self")
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16, spec_disable_by_batch_size=1)
    # flat pass costs: every draft pays, alone or batched
    pipe.engine.costs = CostModel(target_s={n: 0.002 for n in range(1, 150)}, draft_s_per_token=0.0005, frozen=True)
    copying = pipe.codec.encode("copy me: ")
    monkeypatch.setattr(Generation, "outlook", lambda self: ([1.0], 8) if self.prompt_ids == copying else ([0.0], 8))
    imposed: dict[bool, list[tuple[int | None, str | None]]] = {True: [], False: []}
    plan = Generation.plan
    monkeypatch.setattr(
        Generation,
        "plan",
        lambda self, k=None, why=None: imposed[self.prompt_ids == copying].append((k, why)) or plan(self, k, why),
    )
    requests = [Request("copy me: ", 40), Request("not me", 6)]
    outcomes = run(pipe, requests, scheduler)
    rounds = len(imposed[False])  # the short one's rounds: both decoding
    assert rounds >= 2 and len(imposed[True]) > rounds
    expected_why = "with 2 requests decoding (--spec-disable-by-batch-size 1)"
    assert imposed[True][:rounds] == imposed[False] == [(0, expected_why)] * rounds
    assert {k for k, _ in imposed[True][rounds:]} == {None}  # alone: its own controller
    assert max(outcomes[0].finished.stats.k_chosen) > 0  # ... which drafts
    for r, outcome in zip(requests, outcomes, strict=True):
        alone = pipe.generate(pipe.codec.encode(r.prompt), SamplingParams(), r.stop_config, plain=True)
        assert outcome.text == alone.text


@pytest.mark.parametrize(
    ("option", "given", "value", "bad_setting", "bad_scheduler"),
    [("spec_disable_by_batch_size", "2", 2, 0, 0), ("spec_max_slowdown", "0.1", 0.1, 1.5, -1)],
)
def test_spec_options_go_from_the_command_line_to_the_scheduler_checked(
    monkeypatch, option, given, value, bad_setting, bad_scheduler
):
    flag = "--" + option.replace("_", "-")
    settings = settings_from_args(build_parser().parse_args(["serve", flag, given]))
    assert getattr(settings, option) == value != getattr(ServerSettings(), option)
    made: list[Scheduler] = []
    init = Scheduler.__init__
    monkeypatch.setattr(Scheduler, "__init__", lambda self, *a, **kw: made.append(self) or init(self, *a, **kw))
    with serving(create_app(fake_pipeline(), settings)):
        pass
    assert [getattr(s, option) for s in made] == [value]
    with pytest.raises(ConfigError, match=f"{flag} must be"):
        ServerSettings(**{option: bad_setting})
    with pytest.raises(ConfigError, match=f"{option} must be"):
        Scheduler(
            native_pipeline(k=None, draft="self"),
            ServerMetrics(),
            max_running=8,
            max_queue=16,
            **{option: bad_scheduler},
        )


def test_in_a_batch_a_request_s_own_spec_is_kept(monkeypatch):
    """--k auto, batched: the round's k is chosen for the requests that left k to the server; one whose
    `spec` fixed k drafts that k, and a plain one opens no proposer and drafts nothing, beside them."""
    pipe = native_pipeline(k=None, draft="self")
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16)
    pipe.engine.costs = CostModel(target_s={n: 0.002 for n in range(1, 150)}, draft_s_per_token=0.0005, frozen=True)
    monkeypatch.setattr(Generation, "outlook", lambda self: None if self.proposer is None else ([0.0], 8))
    requests = [
        Request("left to the server", 16),
        Request("another one", 16),
        Request("fixed at three", 16, spec=Speculation("self", 3, 16)),
        Request("plain", 16, spec=Speculation("none", 0, 16)),
    ]
    outcomes = run(pipe, requests, scheduler)
    auto, other, fixed, plain = (o.finished.stats for o in outcomes)
    assert set(auto.k_chosen) == set(other.k_chosen) == {0}  # the batch rule: a draft that fails never pays
    assert max(fixed.k_chosen) == 3 and fixed.drafted > 0 and fixed.accepted == fixed.drafted  # its own k
    assert set(plain.k_chosen) == {0} and plain.drafted == 0
    for r, outcome in zip(requests, outcomes, strict=True):  # greedy: each the text of plain decoding alone
        alone = pipe.generate(pipe.codec.encode(r.prompt), SamplingParams(), r.stop_config, plain=True)
        assert outcome.text == alone.text


def test_a_failing_outlook_costs_its_request_a_draft_not_the_worker(monkeypatch):
    """If asking a request what it expects of its draft raises, that request decodes plainly that
    round and every request still finishes."""
    pipe = native_pipeline(k=None, draft="self")
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16)
    broken = pipe.codec.encode("broken: ")

    def outlook(self):
        if self.prompt_ids == broken:
            raise RuntimeError("a proposer bug")
        return ([0.9], 4)

    monkeypatch.setattr(Generation, "outlook", outlook)
    outcomes = run(pipe, [Request("broken: ", 12), Request("fine", 12)], scheduler)
    assert [o.finished.stats.output_tokens for o in outcomes] == [12, 12]


def test_an_idle_server_measures_a_stale_table_again_and_gives_way_to_a_request(monkeypatch):
    """A stale pass-cost table (CostModel.stale) is measured again on the worker thread while no request runs
    or waits, never inside a request (Engine.remeasure_if_stale). A request that arrives meanwhile stops the
    measurement and runs on the table as it was; the table is measured once the server is idle again."""
    pipe = fake_pipeline(draft="other", k=None)
    engine = pipe.engine
    engine.calibrate()
    costs = engine.costs
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=8, max_queue=16)
    stale = [True]
    monkeypatch.setattr(costs, "stale", lambda: stale[0])
    request = Request("arrives while the server measures", 12)
    events: list[Event] = []
    job = Job("job-0", pipe.codec.encode(request.prompt), request.sampling, request.stop_config, events.append, WAIT)
    attempts: list[tuple[bool, int]] = []  # (measured to the end, engine steps so far)
    measured = threading.Event()
    calibrate = costs.calibrate

    def calibrating(*args, **kwargs) -> bool:
        if not attempts:
            scheduler.submit(job)  # the request arrives as the first measurement starts
        done = calibrate(*args, **kwargs)
        attempts.append((done, costs.steps))
        if done:
            stale[0] = False
            measured.set()
        return done

    monkeypatch.setattr(costs, "calibrate", calibrating)
    scheduler.start()
    assert measured.wait(WAIT)
    assert scheduler.close(WAIT)
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.finish_reason == "length"
    assert finished.stats.output_tokens == 12
    assert [done for done, _ in attempts] == [False, True]  # given way to the request, then measured
    assert attempts[0][1] == 0 and attempts[1][1] >= finished.stats.target_passes  # after the request's steps
