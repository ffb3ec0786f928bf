"""The sampled output has exactly the target's distribution, at every output position.

Harness: target p_t and draft q_t depend only on the output position t, so the token emitted at
position t must be distributed as p_t whatever happened before. We run the speculative loop many
times (draft tokens drawn from q, the verifier deciding) and compare the empirical frequencies at
each position with p_t by Pearson's chi-square test. Both verifiers: standard rejection sampling
(verify_sampled, the reference) and the engine's seeded positional rule (verify_positional, one seed per
trial), whose output must also equal plain positional decoding token for token.

False-failure rate: each test function makes at most 4 positions x 1 chi-square tests at level
ALPHA / 4 (Bonferroni), so a correct verifier fails a given test with probability <= ALPHA = 1e-4.
Seeds are fixed, so the outcome is also reproducible. Power: the planted-bug tests at the end show
the same harness rejects a residual that ignores q, a bonus drawn from q, and accept-everything.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import binomtest, chisquare

from spekula.config import SamplingParams
from spekula.noise import PositionalNoise, draw
from spekula.proposers import DraftModelProposer
from spekula.sampling import probabilities, sample
from spekula.testing import FunctionBackend
from spekula.verify import Verdict, _accepted_prefix, verify_positional, verify_sampled

ALPHA = 1e-4
V, K, T, TRIALS = 6, 3, 4, 6000


def simulate(
    p: torch.Tensor,
    q: torch.Tensor | None,
    verify=verify_sampled,
    *,
    seed: int = 0,
    trials: int = TRIALS,
    draft_rule=None,
) -> torch.Tensor:
    """Counts [T, V] of the token emitted at each output position.

    p: [T + K, V] target distribution per position; q: [T + K, V] draft distribution or None for a
    deterministic proposer (then draft_rule(position) picks its token).
    """
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(T, V, dtype=torch.long)
    for _ in range(trials):
        out: list[int] = []
        while len(out) < T:
            t = len(out)
            if q is not None:
                draft = sample(q[t : t + K], g)  # [K]
                qs = q[t : t + K]
            else:
                draft = torch.tensor([draft_rule(t + i) for i in range(K)])
                qs = None
            verdict = verify(draft, qs, p[t : t + K + 1], g)
            out.extend(verdict.emitted(draft.tolist()))
        for i, tok in enumerate(out[:T]):
            counts[i, tok] += 1
    return counts


def pvalues(counts: torch.Tensor, p: torch.Tensor) -> list[float]:
    """Chi-square p-value per position; tokens with p = 0 must never appear."""
    result = []
    for t in range(T):
        zero = p[t] == 0
        assert counts[t][zero].sum() == 0, f"position {t}: emitted a token the target gives probability 0"
        support = p[t][~zero].double()
        expected = support / support.sum() * counts[t].sum()
        result.append(float(chisquare(counts[t][~zero].double(), expected).pvalue))
    return result


def assert_target_distribution(counts: torch.Tensor, p: torch.Tensor) -> None:
    ps = pvalues(counts, p)
    assert min(ps) > ALPHA / T, f"emitted tokens are not distributed as p: chi-square p-values {ps}"


def random_dist(rows: int, seed: int, sharpness: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, V, generator=g) * sharpness, dim=-1)


def test_random_p_and_q():
    p, q = random_dist(T + K, 1), random_dist(T + K, 2)
    assert_target_distribution(simulate(p, q), p)


def test_q_equals_p_accepts_everything_and_keeps_p():
    p = random_dist(T + K, 3)
    assert_target_distribution(simulate(p, p.clone(), seed=1), p)


def test_deterministic_proposer_one_hot_q():
    p = random_dist(T + K, 4)
    assert_target_distribution(simulate(p, None, seed=2, draft_rule=lambda pos: pos % V), p)


def test_q_zero_where_p_is_not():
    p = random_dist(T + K, 5)
    q = random_dist(T + K, 6)
    q[:, :3] = 0.0  # the draft never proposes tokens 0-2; only recovered tokens can produce them
    q = q / q.sum(-1, keepdim=True)
    assert_target_distribution(simulate(p, q, seed=3), p)


def test_p_with_zeros():
    p = random_dist(T + K, 7)
    p[:, 4:] = 0.0  # the target forbids tokens 4 and 5, which the draft proposes often
    p = p / p.sum(-1, keepdim=True)
    q = random_dist(T + K, 8)
    assert_target_distribution(simulate(p, q, seed=4), p)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.2),
    ],
    ids=["top_k", "top_p", "min_p"],
)
def test_filtered_distributions(params):
    g = torch.Generator().manual_seed(9)
    p = probabilities(torch.randn(T + K, V, generator=g) * 2, params)
    q = probabilities(torch.randn(T + K, V, generator=g) * 2, params)
    assert_target_distribution(simulate(p, q, seed=5), p)


def simulate_draft_model(
    p: torch.Tensor, q: torch.Tensor, confidence: float, *, seed: int, trials: int = TRIALS
) -> tuple[torch.Tensor, Counter]:
    """As simulate, with the draft from a real DraftModelProposer whose model's next-token
    distribution at output position t is q[t], stopping at its first token with q < confidence:
    draft lengths depend on the drafted tokens. Returns (counts [T, V], draft lengths seen)."""
    prompt = [0]
    logits = q.log()
    model = FunctionBackend(lambda prefix: logits[len(prefix) - len(prompt)], V)
    sampling = SamplingParams(temperature=1.0)
    counts = torch.zeros(T, V, dtype=torch.long)
    lengths: Counter = Counter()
    for trial in range(trials):
        proposer = DraftModelProposer(model, confidence)
        noise = PositionalNoise.from_seed(seed * trials + trial)
        out: list[int] = []
        while len(out) < T:
            t = len(out)
            draft = proposer.propose(prompt + out, K, sampling, noise.at(t))
            lengths[len(draft)] += 1
            verdict = verify_positional(draft.tokens, p[t : t + len(draft) + 1], noise.at(t))
            out.extend(verdict.emitted(draft.tokens))
            proposer.observe(prompt + out, verdict)
        for i, tok in enumerate(out[:T]):
            counts[i, tok] += 1
    return counts, lengths


def test_a_draft_that_stops_at_its_first_unsure_token_keeps_p():
    p, q = random_dist(T + K, 11), random_dist(T + K, 12)
    counts, lengths = simulate_draft_model(p, q, confidence=0.25, seed=6)
    assert lengths[1] > 0 and lengths[K] > 0  # drafts did stop early, and some ran to K
    assert_target_distribution(counts, p)


# ---- the seeded positional rule (the engine's): p's distribution, and plain decoding's output ---------------


def simulate_positional(
    p: torch.Tensor, q: torch.Tensor | None, *, seed: int, trials: int = TRIALS, draft_rule=None, verify=None
) -> torch.Tensor:
    """As simulate, with trial i's randomness from seed (seed * trials + i) through spekula.noise: a draft
    model's token i is draw(q_i, u_i), coupled to the target's draw; a deterministic proposer drafts
    draft_rule(position). Every trial's output must be plain positional decoding's, draw(p_t, u_t)."""
    verify = verify or verify_positional
    counts = torch.zeros(T, V, dtype=torch.long)
    for trial in range(trials):
        noise = PositionalNoise.from_seed(seed * trials + trial)
        out: list[int] = []
        while len(out) < T:
            t = len(out)
            if q is not None:
                draft = [draw(q[t + i], noise.uniform(t + i)) for i in range(K)]
            else:
                draft = [draft_rule(t + i) for i in range(K)]
            out.extend(verify(draft, p[t : t + K + 1], noise.at(t)).emitted(draft))
        if verify is verify_positional:
            assert out[:T] == [draw(p[t], noise.uniform(t)) for t in range(T)]
        for i, tok in enumerate(out[:T]):
            counts[i, tok] += 1
    return counts


@pytest.mark.parametrize(
    "case",
    ["random p and q", "q equals p", "q zero where p is not", "p zero where q is not", "one-hot drafts"],
)
def test_positional_rule_keeps_p(case):
    p, q = random_dist(T + K, 21), random_dist(T + K, 22)
    draft_rule = None
    if case == "q equals p":
        q = p.clone()
    elif case == "q zero where p is not":
        q[:, :3] = 0.0
        q = q / q.sum(-1, keepdim=True)
    elif case == "p zero where q is not":
        p[:, 4:] = 0.0
        p = p / p.sum(-1, keepdim=True)
    elif case == "one-hot drafts":
        q, draft_rule = None, lambda pos: pos % V
    assert_target_distribution(simulate_positional(p, q, seed=7, draft_rule=draft_rule), p)


def test_positional_rule_accepts_a_one_hot_draft_with_probability_p():
    """A point-mass draft x is accepted iff the target's draw is x: with probability p(x), as rejection
    sampling's min(1, p(x) / 1). Exact binomial test at level ALPHA."""
    p = random_dist(K + 1, 23)
    x = int(torch.argsort(p[0])[V // 2])  # a token of middling probability
    accepted = sum(verify_positional([x], p[:2], PositionalNoise.from_seed(s)).num_accepted for s in range(TRIALS))
    assert binomtest(accepted, TRIALS, float(p[0, x])).pvalue > ALPHA


def test_positional_accept_everything_is_detected():
    """Power for the positional rule: a verifier that keeps every coupled draft emits q, not p."""

    def accept_all(draft, p, noise):
        k = len(draft)
        return Verdict(k, draw(p[k], noise.uniform(k)), k)

    p, q = random_dist(T + K, 1), random_dist(T + K, 2)
    p_values = pvalues(simulate_positional(p, q, seed=8, trials=4000, verify=accept_all), p)
    assert min(p_values) < ALPHA / T, f"the harness missed accept-everything: p-values {p_values}"


# ---- the harness has power: planted bugs are caught -----------------------------------------


def _buggy(residual_ignores_q=False, bonus_from_q=False, accept_all=False):
    def verify(draft, q, p, g):
        k = draft.shape[0]
        idx = torch.arange(k)
        p_x, q_x = p[idx, draft], q[idx, draft]
        u = torch.rand(k, generator=g)
        n = k if accept_all else _accepted_prefix(u * q_x < p_x)
        if n == k:
            return Verdict(k, int(sample(q[k - 1] if bonus_from_q else p[k], g)), k)
        residual = p[n] if residual_ignores_q else torch.clamp(p[n] - q[n], min=0)
        return Verdict(n, int(sample(residual / residual.sum(), g)), k)

    return verify


@pytest.mark.parametrize("bug", ["residual_ignores_q", "bonus_from_q", "accept_all"])
def test_planted_bugs_are_detected(bug):
    p, q = random_dist(T + K, 1), random_dist(T + K, 2)
    p_values = pvalues(simulate(p, q, verify=_buggy(**{bug: True}), trials=4000), p)
    assert min(p_values) < ALPHA / T, f"the harness missed a planted bug ({bug}): p-values {p_values}"
