"""Logits -> probabilities, one function for the draft and the target alike.

Losslessness needs p and q to be the distributions the user asked for: if the draft were filtered
differently from the target, the verifier would still return samples of p, but acceptance would
drop. If the target were filtered differently from plain decoding, the output would be wrong. So
both paths call `probabilities` with the same SamplingParams, and plain decoding is the k = 0 case
of the same loop.

Any temperature > 0 is served as asked, however small: dividing raw logits by 1e-38 would overflow
to inf (and inf - inf is NaN in the softmax), so the logits are shifted by their row maximum first.
The best token then sits at exactly 0 and every other at -(gap / temperature), which may round to
-inf but never to +inf or NaN. A tiny temperature therefore gives the limit of softmax(logits / T)
as T -> 0: all mass on the argmax, shared evenly by exact ties. It stays a sampled request (its
seed is used, ties are drawn), not a silent switch to greedy decoding.
"""

from __future__ import annotations

import numpy as np
import torch

from spekula.config import SamplingParams


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distributions over the vocabulary, one per row.

    Args:
        logits: [..., V] raw model outputs (any float dtype).
        params: temperature, top-k, top-p, min-p. With temperature 0 (greedy) the model's own
            softmax is returned unfiltered: greedy decoding takes its argmax, and traces show it
            as the model's confidence.
    Returns:
        [..., V] float32, each row sums to 1.
    """
    logits = logits.float()
    if params.greedy:
        return torch.softmax(logits, dim=-1)
    logits = _tempered(logits, params.temperature)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        floor = params.min_p * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature shifted so that each row's maximum is 0: finite or -inf for any temperature > 0,
    even one that rounds to 0 in float32 (the maximum is kept at exactly 0, not divided, so no 0 / 0 reaches
    the softmax)."""
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # [..., V], <= 0
    return torch.where(shifted == 0, shifted, shifted / temperature)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (the token that
    crosses the threshold is kept), renormalised."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of strictly better tokens
    drop = mass_before >= top_p  # [..., V]
    drop[..., 0] = False  # the most likely token always stays, even when a tiny top_p rounds to 0 in float32
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary; ties go to the lowest id, identically for every caller. A CPU float32
    tensor goes through numpy's argmax (the same answer: the first maximum, a NaN counting as one), which
    on one row of a large vocabulary is many times cheaper than torch's (scripts/experiments/step_overhead.py
    measures the step stage by stage), and runs at every greedy step."""
    if _numpy_argmax(logits):
        return torch.from_numpy(np.asarray(logits.numpy().argmax(axis=-1)))
    return torch.argmax(logits, dim=-1)


def greedy_ids(logits: torch.Tensor) -> list[int]:
    """greedy_token of each row of [n, V] logits, as Python ints. The CPU float32 path calls no torch operator:
    right after a target pass has streamed the weights through the caches, each torch dispatch costs tens of
    microseconds (scripts/experiments/step_overhead.py), and greedy plain decoding runs this once a token."""
    if _numpy_argmax(logits):
        return logits.numpy().argmax(axis=-1).tolist()
    return torch.argmax(logits, dim=-1).tolist()


def _numpy_argmax(logits: torch.Tensor) -> bool:
    return logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of [..., V] probabilities, drawn with the request's generator."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
