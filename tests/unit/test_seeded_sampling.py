"""A seed fixes the sample: a seeded sampled request gives plain decoding's text with any k, any proposer, k=auto
and a k that changes at random from step to step (spekula.noise, spekula.verify.verify_positional). The server's
batched rounds: tests/server/test_scheduler.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.control import FixedK
from spekula.cost import CostModel
from spekula.draft_class import NO_DRAFT
from spekula.engine import Engine
from spekula.noise import PositionalNoise, draw
from spekula.proposers import DraftModelFactory, NgramFactory, SuffixFactory
from spekula.sampling import probabilities
from spekula.testing import random_table_backend

VOCAB = 40
PROMPTS = [[1, 2, 3, 4, 5], [7], [3, 9, 3, 9, 3, 9, 3]]
SAMPLINGS = {
    "t=1": SamplingParams(temperature=1.0, seed=11),
    "t=0.8,top_p": SamplingParams(temperature=0.8, top_p=0.9, seed=12),
    "t=1.2,top_k,min_p": SamplingParams(temperature=1.2, top_k=8, min_p=0.05, seed=13),
}


def target():
    return random_table_backend(VOCAB, seed=0, order=2)


def proposers():
    return {
        "same-model": DraftModelFactory(random_table_backend(VOCAB, seed=0, order=2)),  # accepts everything
        "close-model": DraftModelFactory(random_table_backend(VOCAB, seed=0, order=2, scale=2.0)),  # q != p
        "random-model": DraftModelFactory(random_table_backend(VOCAB, seed=123, order=2)),  # rejects nearly all
        "ngram": NgramFactory(4, 1),
        "suffix": SuffixFactory(),
    }


@dataclass
class RandomK(FixedK):
    """A k drawn anew at every step: whatever k a controller chooses, the text must not move."""

    k: int = 8
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def choose_k(self, remaining=None, catch_up=0, draft_class=None, longest=None, draft_pass_apart=False) -> int:
        self.reason = "random"
        return 0 if draft_class == NO_DRAFT else self.rng.randint(0, self.k)


def frozen_costs() -> CostModel:
    """Costs under which k=auto drafts (a draft is cheap next to a pass), the same on every machine."""
    return CostModel(target_s={n: 0.002 for n in range(1, 18)}, draft_s_per_token=0.0002, frozen=True)


def generate(engine, prompt, sampling, max_tokens=40, controller=None):
    return engine.generate(prompt, sampling, StopConfig(max_tokens=max_tokens), controller=controller).run()


def expected_tokens(backend, prompt, sampling, max_tokens) -> list[int]:
    """The rule written out, with no engine: output position j's token is draw(p_j, u_j)."""
    noise = PositionalNoise.from_seed(sampling.seed)
    out: list[int] = []
    for j in range(max_tokens):
        p = probabilities(backend.logits_fn(prompt + out), sampling)
        out.append(draw(p, noise.uniform(j)))
    return out


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS)
def test_plain_sampled_decoding_is_the_positional_rule(sampling):
    t = target()
    for prompt in PROMPTS:
        assert generate(Engine(t), prompt, sampling).token_ids == expected_tokens(t, prompt, sampling, 40)


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS)
@pytest.mark.parametrize("name", ["same-model", "close-model", "random-model", "ngram", "suffix"])
def test_a_seeded_request_gives_plain_decoding_s_text_whatever_k(name, sampling):
    t = target()
    for prompt in PROMPTS:
        plain = generate(Engine(t), prompt, sampling)
        runs = {k: generate(Engine(t, proposers()[name], SpecConfig(k=k)), prompt, sampling) for k in (1, 4, 8)}
        auto = Engine(t, proposers()[name], SpecConfig(k=None))
        auto.costs = frozen_costs()
        runs["auto"] = generate(auto, prompt, sampling)
        runs["random k"] = generate(
            Engine(t, proposers()[name], SpecConfig(k=8)), prompt, sampling, controller=RandomK()
        )
        for k, run in runs.items():
            assert run.token_ids == plain.token_ids, f"{name}, k={k}"
            assert run.finish_reason == plain.finish_reason == "length"
        if name in ("same-model", "close-model"):  # the drafts were verified, not skipped, k=auto's too
            assert all(runs[k].stats.accepted > 0 for k in (4, "auto", "random k"))


def test_the_same_seed_repeats_and_another_seed_differs():
    """On one engine the second request hits the prompt cache (and the suffix proposer recalls the first
    request's output): the text is the same. Another seed gives another text."""
    engine = Engine(target(), SuffixFactory(), SpecConfig(k=None))
    engine.costs = frozen_costs()
    sampling = SamplingParams(temperature=1.0, seed=5)
    first = generate(engine, PROMPTS[0], sampling)
    second = generate(engine, PROMPTS[0], sampling)
    assert second.token_ids == first.token_ids and second.stats.cached_tokens > 0
    others = [generate(engine, PROMPTS[0], SamplingParams(temperature=1.0, seed=s)).token_ids for s in (6, 7)]
    assert all(o != first.token_ids for o in others) and others[0] != others[1]


def test_unseeded_requests_differ_and_leave_torch_s_rng_alone():
    engine = Engine(target(), NgramFactory(4, 1), SpecConfig(k=4))
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = generate(engine, PROMPTS[0], SamplingParams(temperature=1.0))
    torch.manual_seed(0)
    b = generate(engine, PROMPTS[0], SamplingParams(temperature=1.0))
    assert a.token_ids != b.token_ids
    assert torch.equal(torch.get_rng_state(), state)


def test_a_sampled_draft_needs_the_request_s_noise():
    proposer = proposers()["same-model"].create()
    with pytest.raises(ValueError, match="noise"):
        proposer.propose([1, 2, 3], 4, SamplingParams(temperature=1.0), None)
    assert len(proposer.propose([1, 2, 3], 4, SamplingParams(), None)) == 4  # greedy needs none
