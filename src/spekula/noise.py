"""The randomness of a sampled request: one uniform number per output position, a pure function of (seed, position).

Why per position and not one stream: a stream (a torch.Generator consumed step by step) hands a position whatever
numbers the steps before it happened to use, and how many they used depends on k (which k=auto picks from measured
timings), on how many drafted tokens were accepted, on the proposer and on batching. The same seeded request would
then give another text with another k. Here the output token at position j (the j-th token this request generates,
counted from 0, so a prompt-cache hit, a batch or a proposer changes nothing) is

    draw(p_j, u_j),   u_j = uniform(seed, j) in [0, 1)

whatever produced p_j's step. Plain sampled decoding (k = 0) is exactly this rule, and the verifier
(spekula.verify.verify_positional) accepts a drafted token iff it equals this draw, so a seeded request gives the
same text with any k, any batch, any proposer and with speculation off, as far as p_j itself does not move: a
runtime that scores a block or a batch with other kernels than one token (llama.cpp without --exact) changes p_j
by its rounding, which moves the draw where u_j falls within that change of a token's boundary.

uniform: SplitMix64 (Steele, Lea and Flood 2014) in counter mode over Python ints, so the numbers are the same on
every platform and runtime: the seed (any integer, taken modulo 2^64) is mixed once into a key, and position j's
number is the mix of key + (j + 1) * golden gamma, its top 53 bits as a double. Distinct seeds give distinct keys
(the mix is a bijection of 64-bit words).

draw: the inverse CDF of p at u in token-id order: the first token whose cumulative mass exceeds u x (total mass).
A token of probability 0 is never drawn (its cumulative mass equals its predecessor's), and each token is drawn
with probability its share of the mass, for u uniform. The cumulative sums are float64, accumulated in token order
(torch.cumsum on the CPU), so the interval each token owns is exact to float64 rounding. One cumulative sum and one
binary search over the vocabulary: cheaper than torch.multinomial's exponential race
(scripts/experiments/seeded_coupling.py times both).

An unseeded request draws a random 64-bit seed (random_seed) and then uses the same machinery.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd: SplitMix64's increment
_UNIT = 2.0**-53


def _mix64(z: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit words that scatters every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def random_seed() -> int:
    """A seed for a request that gave none: 64 bits from the operating system, never from torch's global RNG."""
    return secrets.randbits(64)


@dataclass(frozen=True)
class PositionalNoise:
    """A request's uniform numbers, seen from output position `offset`: uniform(i) is position offset + i's.

    The engine holds one per request (offset 0) and hands the verifier and the proposer views shifted to the first
    position a step emits (at()), so neither needs to know where in the output it is."""

    key: int  # _mix64(seed mod 2^64)
    offset: int = 0

    @classmethod
    def from_seed(cls, seed: int) -> PositionalNoise:
        return cls(_mix64(seed & _MASK64))

    def uniform(self, i: int) -> float:
        """u for output position offset + i, in [0, 1)."""
        position = self.offset + i
        if position < 0:
            raise ValueError(f"an output position is >= 0, got {position}")
        return (_mix64((self.key + (position + 1) * _GAMMA) & _MASK64) >> 11) * _UNIT

    def at(self, offset: int) -> PositionalNoise:
        """The same numbers seen from `offset` positions further on."""
        return PositionalNoise(self.key, self.offset + offset)


def request_noise(seed: int | None) -> PositionalNoise:
    """A request's noise: from its seed, or from a fresh random seed when it has none."""
    return PositionalNoise.from_seed(random_seed() if seed is None else seed)


def draw(probs: torch.Tensor, u: float) -> int:
    """The token at a position from its distribution [V] (any non-negative weights, not necessarily normalised)
    and its uniform u in [0, 1): the first token id whose cumulative mass exceeds u x total."""
    # [V], in token-id order; summed in place in its own copy: one buffer per draw (a second one, freed right after,
    # costs the allocator several times the sum itself on a 151,936-token vocabulary)
    cumulative = probs.to(torch.float64, copy=True).cumsum_(0)
    threshold = torch.tensor([u], dtype=torch.float64, device=cumulative.device) * cumulative[-1:]  # [1]
    token = int(torch.searchsorted(cumulative, threshold, right=True))
    if token < cumulative.shape[0]:
        return token
    # u x total rounded up to the total itself (u within 2^-53 of 1): the last token with mass, as u -> 1 would give
    return int(torch.nonzero(probs > 0)[-1])
