"""The loop, with in-memory models of known logits: losslessness, cache invariants, stops, errors."""

from __future__ import annotations

import pytest
import torch

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.errors import ConfigError
from spekula.proposers import DraftModelFactory, NgramFactory, SuffixFactory, build_proposer
from spekula.testing import FunctionBackend, FunctionSequence, random_table_backend
from spekula.trace import ListTrace

from costkit import llamacpp_avx512

VOCAB = 40
PROMPTS = [[1, 2, 3, 4, 5], [7], [3, 9, 3, 9, 3, 9, 3]]


def target():
    return random_table_backend(VOCAB, seed=0, order=2)


def proposers():
    return {
        "same-model": DraftModelFactory(random_table_backend(VOCAB, seed=0, order=2)),  # alpha ~ 1
        "random-model": DraftModelFactory(random_table_backend(VOCAB, seed=123, order=2)),  # alpha ~ 0
        "ngram": NgramFactory(4, 1),
        "suffix": SuffixFactory(),
    }


def run(engine, prompt, max_tokens=30, sampling=SamplingParams(), **kw):
    return engine.generate(prompt, sampling, StopConfig(max_tokens=max_tokens, **kw)).run()


@pytest.mark.parametrize("name", ["same-model", "random-model", "ngram", "suffix"])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_speculative_equals_plain(name, k):
    t = target()
    for prompt in PROMPTS:
        plain = run(Engine(t), prompt)
        spec = run(Engine(t, proposers()[name], SpecConfig(k=k)), prompt)
        assert spec.token_ids == plain.token_ids
        assert spec.finish_reason == plain.finish_reason == "length"


def test_acceptance_extremes():
    t = target()
    same = run(Engine(t, proposers()["same-model"], SpecConfig(k=4)), PROMPTS[0], max_tokens=40)
    rand = run(Engine(t, proposers()["random-model"], SpecConfig(k=4)), PROMPTS[0], max_tokens=40)
    assert same.stats.alpha == 1.0 and same.stats.tau == 5.0  # 8 passes of 4 accepted + 1 bonus
    assert same.stats.target_passes < rand.stats.target_passes
    assert rand.stats.alpha < 0.3


def test_plain_decoding_counts():
    g = run(Engine(target()), PROMPTS[0], max_tokens=12)
    s = g.stats
    assert (s.output_tokens, s.target_passes, s.drafted, s.tau, s.alpha) == (12, 12, 0, 1.0, None)


@pytest.mark.parametrize("k", [0, 4])
def test_the_prompt_is_prefilled_in_the_first_step_s_pass(k, monkeypatch):
    """No pass of its own for the prompt: the first step's pass carries what is left of it in front
    of the pending token and the draft (as llama.cpp's own loop takes its first token from the
    prompt's pass), so n steps cost n passes. That pass and its tokens count as the prefill's."""
    calls = []
    forward = FunctionSequence.forward
    t = target()

    def counted(self, token_ids, num_logits=None):
        if self.backend is t:  # the target's passes, not the draft model's
            calls.append((len(token_ids), num_logits))
        return forward(self, token_ids, num_logits)

    monkeypatch.setattr(FunctionSequence, "forward", counted)
    engine = Engine(t, proposers()["same-model"], SpecConfig(k=k)) if k else Engine(t)
    prompt = PROMPTS[0]
    g = run(engine, prompt, max_tokens=12)
    s = g.stats
    assert len(calls) == s.target_passes
    assert calls[0] == (len(prompt) - 1 + 1 + k, 1 + k)  # the prompt but its last token, then the step's block
    assert s.prefill_s > 0 and s.ttft_s is not None and s.prefill_s <= s.total_s
    first = 1 + k  # the draft model is the target: every drafted token is accepted
    assert s.prefill_output_tokens == first
    assert s.decode_tokens_per_s == pytest.approx((s.output_tokens - first) / (s.total_s - s.prefill_s))
    assert g.token_ids == run(Engine(target()), prompt, max_tokens=12).token_ids


def test_a_one_token_prompt_has_nothing_to_prefill():
    g = run(Engine(target()), PROMPTS[1], max_tokens=5)
    assert g.stats.prefill_output_tokens == 0 and g.stats.output_tokens == g.stats.target_passes == 5


@pytest.mark.parametrize("name", ["same-model", "random-model", "ngram", "suffix"])
def test_caches_hold_exactly_the_committed_tokens(name):
    t = target()
    gen = Engine(t, proposers()[name], SpecConfig(k=4)).generate(
        PROMPTS[2], SamplingParams(temperature=1.0, seed=3), StopConfig(max_tokens=40)
    )
    for _ in gen:
        committed = PROMPTS[2] + gen.token_ids
        assert gen.target_sequence.tokens == committed[:-1]  # the last token is pending
        draft_seq = getattr(gen.proposer, "sequence", None)
        if draft_seq is not None:
            assert draft_seq.tokens == committed[: len(draft_seq.tokens)]
            assert len(draft_seq.tokens) >= len(committed) - 2  # rolled back, not reset


def test_draft_cache_is_reused_not_reprefilled():
    draft_model = random_table_backend(VOCAB, seed=123, order=2)  # rejects often: many rollbacks
    prompt = list(range(1, 30))
    g = run(Engine(target(), DraftModelFactory(draft_model), SpecConfig(k=4)), prompt, max_tokens=60)
    # prefill once, then per step at most 2 catch-up tokens plus k - 1 drafted ones
    assert draft_model.tokens_fed <= len(prompt) + g.stats.target_passes * (2 + 3)
    assert g.stats.target_passes > 20


def test_a_request_that_never_drafts_never_opens_a_draft_cache():
    draft_model = random_table_backend(VOCAB, seed=123, order=2)
    gen = Engine(target(), DraftModelFactory(draft_model), SpecConfig(k=0)).generate(
        PROMPTS[0], SamplingParams(), StopConfig(max_tokens=8)
    )
    gen.run()
    assert draft_model.tokens_fed == 0 and gen.proposer._sequence is None  # k = 0 all along: no context, no prefill
    assert gen.stats.output_tokens == 8


def test_per_position_acceptance_is_consistent():
    g = run(
        Engine(target(), proposers()["random-model"], SpecConfig(k=3)),
        PROMPTS[0],
        sampling=SamplingParams(temperature=1.0, seed=1),
    )
    s = g.stats
    assert sum(s.drafted_per_position) == s.drafted and sum(s.accepted_per_position) == s.accepted
    assert all(a <= d for a, d in zip(s.accepted_per_position, s.drafted_per_position, strict=True))
    assert s.drafted_per_position == sorted(s.drafted_per_position, reverse=True)


def test_seeded_sampling_repeats_exactly():
    t = target()
    e = Engine(t, proposers()["random-model"], SpecConfig(k=3))
    a = run(e, PROMPTS[0], sampling=SamplingParams(temperature=0.9, top_p=0.9, seed=42))
    b = run(e, PROMPTS[0], sampling=SamplingParams(temperature=0.9, top_p=0.9, seed=42))
    c = run(e, PROMPTS[0], sampling=SamplingParams(temperature=0.9, top_p=0.9, seed=43))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def eos_backend(eos_at: int):
    """Emits 10, 11, 12, ... and EOS (= 0) at output position eos_at, whatever the prompt."""

    def logits_fn(prefix):
        out = torch.zeros(VOCAB)
        n = len(prefix) - 3  # prompts in these tests have 3 tokens
        out[0 if n == eos_at else 10 + n % 20] = 10.0
        return out

    return FunctionBackend(logits_fn, VOCAB, eos=0)


@pytest.mark.parametrize("k", [0, 3])
def test_stops_at_eos_without_emitting_it(k):
    t = eos_backend(eos_at=5)
    draft = DraftModelFactory(eos_backend(eos_at=5)) if k else None
    g = run(Engine(t, draft, SpecConfig(k=k)), [1, 2, 3], max_tokens=50)
    assert g.token_ids == [10, 11, 12, 13, 14]
    assert g.finish_reason == "stop"
    g2 = run(Engine(t, draft, SpecConfig(k=k)), [1, 2, 3], max_tokens=50, ignore_eos=True)
    assert len(g2.token_ids) == 50 and 0 in g2.token_ids


@pytest.mark.parametrize("k", [0, 3, 8])
def test_max_tokens_is_exact(k):
    t = target()
    draft = proposers()["same-model"] if k else None
    for n in (1, 2, 7):
        g = run(Engine(t, draft, SpecConfig(k=k)), PROMPTS[0], max_tokens=n)
        assert len(g.token_ids) == n and g.finish_reason == "length"


def test_stop_token_ids():
    g = run(Engine(eos_backend(99)), [1, 2, 3], max_tokens=20, stop_token_ids={13})
    assert g.token_ids == [10, 11, 12] and g.finish_reason == "stop"


def test_context_limit_stops_with_length():
    t = random_table_backend(VOCAB, seed=0)
    t.context_length = 20
    g = run(Engine(t, NgramFactory(), SpecConfig(k=8)), PROMPTS[0], max_tokens=100)
    assert len(PROMPTS[0]) + len(g.token_ids) == 20 and g.finish_reason == "length"


def test_trace_records_every_step():
    trace = ListTrace()
    t = target()
    g = (
        Engine(t, proposers()["random-model"], SpecConfig(k=4))
        .generate(PROMPTS[0], SamplingParams(), StopConfig(max_tokens=20), trace)
        .run()
    )
    assert sum(len(r.emitted) for r in trace.steps) == len(g.token_ids) == 20
    assert len(trace.steps) == g.stats.target_passes
    for r in trace.steps:
        assert len(r.drafted) <= 4 and r.accepted <= len(r.drafted)
        assert (r.rejection is None) == (r.accepted == len(r.drafted))
        if r.rejection:
            assert len(r.rejection["target_top5"]) == 5 and r.rejection["why"]
        assert set(r.timings) == {"draft", "score", "accept", "advance"}
    assert trace.requests[0]["token_ids"] == g.token_ids


@pytest.mark.parametrize(
    "draft_seed, scale, confidence, drafted_per_step",
    [
        (123, 0.1, 0.5, 1),  # a flat draft (every token ~1/40): each draft stops after its first token
        (0, 3.0, 1e-6, 4),  # a threshold nothing falls below: every draft is k long
    ],
)
def test_draft_confidence_stops_at_the_first_unsure_token_and_stays_lossless(
    draft_seed, scale, confidence, drafted_per_step
):
    t = target()
    draft = DraftModelFactory(random_table_backend(VOCAB, seed=draft_seed, order=2, scale=scale), confidence=confidence)
    trace = ListTrace()
    for prompt in PROMPTS:
        plain = run(Engine(t), prompt)
        gen = Engine(t, draft, SpecConfig(k=4, draft_confidence=confidence)).generate(
            prompt, SamplingParams(), StopConfig(max_tokens=30), trace
        )
        spec = gen.run()
        assert spec.token_ids == plain.token_ids
    steps = [r for r in trace.steps if r.k == 4]
    assert steps and all(
        len(r.drafted) == drafted_per_step for r in steps
    )  # asked for 4, drafted what the threshold allows


def test_draft_confidence_applies_to_draft_models_only():
    assert build_proposer("ngram", SpecConfig(), target=target()) is not None
    with pytest.raises(ConfigError, match="has no probabilities to stop on"):
        build_proposer("ngram", SpecConfig(draft_confidence=0.4), target=target())
    factory = build_proposer(
        "x", SpecConfig(draft_confidence=0.4), target=target(), load_draft=lambda _: random_table_backend(VOCAB, 1)
    )
    assert factory.create().confidence == 0.4


def test_closing_early_frees_the_caches():
    gen = Engine(target(), proposers()["same-model"], SpecConfig(k=2)).generate(
        PROMPTS[0], SamplingParams(), StopConfig(max_tokens=50)
    )
    next(iter(gen))
    gen.close()
    assert gen.target_sequence.tokens == [] and gen.proposer.sequence.tokens == []
    assert gen.finish_reason == "abort"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SpecConfig(k=-1), "k (draft length) must be an integer >= 0"),
        (lambda: SpecConfig(draft_confidence=1.0), "--draft-confidence must be a probability > 0 and < 1"),
        (lambda: SamplingParams(top_p=1.5), "top_p must be in (0, 1]"),
        (lambda: SamplingParams(temperature=-1), "temperature must be a finite number >= 0"),
        (lambda: SamplingParams(temperature=float("nan")), "temperature must be a finite number >= 0"),
        (lambda: SamplingParams(temperature=float("inf")), "temperature must be a finite number >= 0"),
        (lambda: SamplingParams(top_k=-2), "top_k must be an integer >= 0"),
        (lambda: SamplingParams(min_p=1.0), "min_p must be in [0, 1)"),
        (lambda: StopConfig(max_tokens=0), "max_tokens must be an integer >= 1"),
        (lambda: Engine(target()).generate([], SamplingParams()), "the prompt is empty"),
        (lambda: Engine(target()).generate([VOCAB + 5]), "outside the vocabulary"),
        (lambda: build_proposer("ngramm", SpecConfig(), target=target()), "unknown proposer 'ngramm'"),
        (
            lambda: build_proposer(
                "x", SpecConfig(), target=target(), load_draft=lambda _: random_table_backend(VOCAB + 1, 0)
            ),
            "different|vocabulary of 41 tokens",
        ),
    ],
)
def test_bad_arguments_give_clear_errors(make, message):
    with pytest.raises(
        ConfigError,
        match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[") if "|" not in message else message,
    ):
        make()


def test_prompt_longer_than_context():
    t = random_table_backend(VOCAB, seed=0)
    t.context_length = 8
    with pytest.raises(ConfigError, match="shorten the prompt"):
        Engine(t).generate(list(range(1, 10)))


def test_auto_k_drafts_no_wider_than_one_pass_verifies():
    """llama.cpp in exact mode scores a block wider than 3 in several passes, all paid even when the first
    drafted token is rejected: k=auto then drafts at most 2 tokens a step (and re-drafts from what was
    accepted); a fixed k is the user's and stays."""

    class PiecewiseBackend(FunctionBackend):
        def single_pass_width(self):
            return 3

    t = random_table_backend(VOCAB, seed=0, order=2)
    piecewise = PiecewiseBackend(t.logits_fn, VOCAB, name="piecewise")
    auto = Engine(piecewise, NgramFactory(4, 1), SpecConfig(k=None, k_max=16))
    assert auto.spec.k_max == 2 and auto.new_controller().k_max == 2
    assert Engine(piecewise, NgramFactory(4, 1), SpecConfig(k=8)).spec.k == 8
    assert Engine(t, NgramFactory(4, 1), SpecConfig(k=None, k_max=16)).spec.k_max == 16  # any width in one pass


def test_what_starting_a_request_costs_counts_into_its_time(monkeypatch):
    """Engine.generate's own work before the request's first step (its checks, its controller: a first
    calibration on an engine never calibrated) is waited for by its caller, so it counts into ttft_s and
    total_s (spekula bench reads them as the request's latency)."""
    import spekula.engine as engine_module
    from spekula.cost import CostModel

    clock = [100.0]
    monkeypatch.setattr(engine_module.time, "perf_counter", lambda: clock[0])  # only the controller takes time
    engine = Engine(random_table_backend(20, seed=0), NgramFactory(4, 1), SpecConfig(k=None))
    engine.costs = CostModel(target_s={1: 0.01, 2: 0.011}, frozen=True)
    new_controller = engine.new_controller

    def slow_controller():
        clock[0] += 5.0
        return new_controller()

    monkeypatch.setattr(engine, "new_controller", slow_controller)
    stats = engine.generate([1, 2, 3], stop=StopConfig(max_tokens=4, ignore_eos=True)).run().stats
    assert stats.output_tokens == 4
    assert stats.ttft_s == stats.total_s == 5.0


def test_the_library_default_drafts_only_where_it_pays():
    """SpecConfig() is k auto, as the CLI's and the server's defaults are: on text whose short matches are not
    continued (a chat reply: suffix lookup finds one- to three-token matches everywhere, and the target goes
    elsewhere), the default's passes cost about what plain decoding's do. A fixed k drafts at every match, and
    at llama.cpp's pass costs that is far slower than plain decoding (the library's default before)."""
    vocab = 8
    table = torch.randn(1024, vocab, generator=torch.Generator().manual_seed(5))

    def chatty(prefix: list[int]) -> torch.Tensor:  # a next token that no earlier text predicts
        return table[len(prefix) % len(table)]

    def seconds(spec: SpecConfig) -> tuple[float, float]:
        engine = Engine(FunctionBackend(chatty, vocab), SuffixFactory(), spec)
        engine.costs = llamacpp_avx512()
        trace = ListTrace()
        engine.generate([1, 2, 3], SamplingParams(), StopConfig(max_tokens=300), trace).run()
        assert sum(len(step.emitted) for step in trace.steps) == 300
        spent = sum(engine.costs.target_cost(len(step.drafted) + 1) for step in trace.steps)
        return spent, 300 * engine.costs.target_cost(1)

    assert SpecConfig().k is None
    spent, plain = seconds(SpecConfig())
    assert spent <= 1.03 * plain
    spent, plain = seconds(SpecConfig(k=4))
    assert spent > 1.3 * plain
