"""spekula.noise: one uniform number per output position from (seed, position), and the inverse-CDF draw.

False-failure rate of the chi-square tests: each is one test at level ALPHA = 1e-4 with fixed seeds, so the
outcome is also reproducible; the planted-bug test shows the joint test has power against a rule that reuses one
number for two positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spekula.noise import _GAMMA, _MASK64, PositionalNoise, _mix64, draw, random_seed, request_noise
from spekula.stats import chi_square_pvalue

ALPHA = 1e-4
SEEDS = 8000


def test_the_mixer_is_splitmix64():
    """Reference outputs of SplitMix64 started at 0 (Vigna's splitmix64.c): the counter mode and the mixer's
    constants are the published ones, so any implementation reproduces a seed's numbers."""
    assert [_mix64(n * _GAMMA & _MASK64) for n in (1, 2, 3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


def test_a_position_s_number_depends_on_the_seed_and_the_position_only():
    noise = PositionalNoise.from_seed(42)
    numbers = [noise.uniform(j) for j in range(1000)]
    assert all(0.0 <= u < 1.0 for u in numbers)
    assert numbers == [PositionalNoise.from_seed(42).uniform(j) for j in range(1000)]  # a fresh object: the same
    assert len(set(numbers)) == 1000
    assert [noise.at(3).uniform(j) for j in range(10)] == numbers[3:13]  # a view from position 3 on
    assert noise.at(3).at(4).uniform(0) == numbers[7]
    other = [PositionalNoise.from_seed(43).uniform(j) for j in range(1000)]
    assert not set(other) & set(numbers)
    assert PositionalNoise.from_seed(-1) == PositionalNoise.from_seed(2**64 - 1)  # seeds are taken modulo 2^64
    with pytest.raises(ValueError, match="position"):
        noise.uniform(-1)


def test_an_unseeded_request_gets_a_random_seed_without_torch_s_rng():
    state = torch.get_rng_state()
    a, b = request_noise(None), request_noise(None)
    assert a != b and 0 <= random_seed() < 2**64
    assert torch.equal(torch.get_rng_state(), state)
    assert request_noise(7) == PositionalNoise.from_seed(7)


@pytest.mark.parametrize("scale", [1.0, 3.0])  # weights need not sum to 1
def test_draw_is_the_inverse_cdf_in_token_order(scale):
    p = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0]) * scale
    cases = {0.0: 1, 0.2499: 1, 0.25: 3, 0.5: 3, 0.7499: 3, 0.75: 4, 0.9: 4, 1.0 - 2.0**-53: 4}
    assert {u: draw(p, u) for u in cases} == cases


def test_draw_never_returns_a_token_of_probability_zero():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        p = torch.rand(50, generator=g)
        p[torch.rand(50, generator=g) < 0.7] = 0.0
        p[-5:] = 0.0  # the last ids have no mass: u near 1 must not land there
        if p.sum() == 0:
            continue
        for u in (0.0, float(torch.rand(1, generator=g)), 1.0 - 2.0**-53):
            assert p[draw(p, u)] > 0


def test_a_position_s_tokens_over_seeds_are_distributed_as_p():
    p = torch.softmax(torch.randn(12, generator=torch.Generator().manual_seed(1)) * 1.5, dim=-1)
    tokens = [draw(p, PositionalNoise.from_seed(s).uniform(5)) for s in range(SEEDS)]
    assert chi_square_pvalue(np.bincount(tokens, minlength=12), p.double().numpy()) > ALPHA


def _joint_counts(uniforms) -> tuple[np.ndarray, np.ndarray]:
    """Counts of (token 0, token 1) when token 1's distribution depends on token 0, and their exact law."""
    g = torch.Generator().manual_seed(2)
    p0 = torch.softmax(torch.randn(4, generator=g), dim=-1)
    p1 = torch.softmax(torch.randn(4, 4, generator=g) * 1.5, dim=-1)  # row: token 0
    counts = np.zeros(16)
    for u0, u1 in uniforms:
        first = draw(p0, u0)
        counts[first * 4 + draw(p1[first], u1)] += 1
    return counts, (p0[:, None] * p1).reshape(-1).double().numpy()


def test_consecutive_positions_are_independent():
    """The joint law of two positions, the second conditioned on the first, is p0 x p1: the prefix carries no
    information about the next position's number."""
    counts, law = _joint_counts(
        (PositionalNoise.from_seed(s).uniform(0), PositionalNoise.from_seed(s).uniform(1)) for s in range(SEEDS)
    )
    assert chi_square_pvalue(counts, law) > ALPHA
    reused, law = _joint_counts((u, u) for u in (PositionalNoise.from_seed(s).uniform(0) for s in range(SEEDS)))
    assert chi_square_pvalue(reused, law) < ALPHA  # power: one number for both positions is caught
