"""The verifier: pure functions of tensors that decide which drafted tokens a step keeps.

Vocabulary (as in vLLM):
- *accepted* tokens: the longest prefix of the draft that passes the test below;
- *recovered* token: at the first rejection, the token the verifier emits in the rejected one's place;
- *bonus* token: when every drafted token is accepted, a token drawn from p at the position after them.
Every call therefore emits between 1 and k + 1 tokens, and each emitted token is distributed exactly
as the target's p at its position, whatever the draft is.

Symbols: p = the target's distribution, q = the draft's (both after the same temperature / top-k /
top-p / min-p: spekula.sampling.probabilities). Greedy requests use verify_greedy (the target's argmax).

Sampled requests: the engine's rule is verify_positional, the seeded positional rule. Output position j
(the request's j-th generated token) has its own uniform u_j, a pure function of (seed, j)
(spekula.noise), and plain sampled decoding emits t_j = draw(p_j, u_j), the inverse CDF of p_j at u_j.
The verifier accepts a drafted token x_j iff x_j == draw(p_j, u_j), and at the first mismatch emits
draw(p_j, u_j) itself as the recovered token; after a full accept the bonus token is draw(p_{j+k}, u_{j+k}).
- Output = plain decoding's, token for token: every emitted token is draw(p_j, u_j) with p_j conditioned on
  the tokens before it, which are plain decoding's by induction (a row of p after an accepted draft token
  was scored on exactly plain decoding's prefix). So a seeded request gives the same text with any k, any
  batch and any proposer, and it has p's distribution because u_j is uniform and independent of u_0..u_{j-1},
  the only randomness the prefix depends on (over seeds: the hash stands for independent draws).
- Acceptance: a point-mass draft x (suffix or n-gram lookup: q = one-hot) is accepted with probability
  P(draw(p, u) = x) = p(x), exactly standard rejection sampling's min(1, p(x) / 1). A draft model draws its
  own token with the same u_j, x_j = draw(q_j, u_j) (the draft is coupled to the target through u): accepted
  with probability sum_x |I_p(x) & I_q(x)|, where I_p(x) is the interval of [0, 1) that x owns in p's CDF.
  That is at most rejection sampling's sum_x min(p(x), q(x)), and less wherever p and q weigh the tokens of
  lower id differently, which shifts x's interval in one CDF against the other
  (scripts/experiments/seeded_coupling.py measures the gap); the draft never changes the output.
- Why the inverse CDF and not Gumbel-max (t_j = argmax(log p_j + g_j)): the Gumbel coupling of a draft model
  accepts somewhat more often, but plain decoding would have to use it too (else the outputs part), and it
  needs V numbers per position for every sampled token, from a generator whose numbers differ by device and
  build; the inverse CDF needs one number, from a hash that is the same everywhere.

verify_sampled is standard rejection sampling (Leviathan et al. 2023, Chen et al. 2023), kept as the
reference the tests and the seeded-coupling experiment compare against: accept x with probability
min(1, p(x) / q(x)); at the first rejection draw the recovered token from normalize(max(0, p - q)); a
proposer without q is q = one-hot (acceptance min(1, p(x)), residual p with x removed). Its randomness is
one stream (a torch.Generator) consumed step by step, so which sample a seed yields depends on k and on the
draft: the engine does not use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spekula.noise import PositionalNoise, draw
from spekula.sampling import greedy_ids, sample


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # drafted tokens kept, 0..k
    next_token: int  # the recovered token (num_accepted < k) or the bonus token (num_accepted == k)
    num_drafted: int  # k

    @property
    def bonus(self) -> bool:
        return self.num_accepted == self.num_drafted

    def emitted(self, draft_tokens: list[int]) -> list[int]:
        """The tokens this step commits: the accepted prefix, then the recovered or bonus token."""
        return list(draft_tokens[: self.num_accepted]) + [self.next_token]


def verify_greedy(
    draft_tokens: Sequence[int] | torch.Tensor,  # [k]
    target_logits: torch.Tensor,  # [k + 1, V]
) -> Verdict:
    """Greedy: keep drafted tokens while they equal the target's argmax; the target's argmax at the
    first mismatch (or after the last draft) is the recovered (or bonus) token. Python ints throughout
    (sampling.greedy_ids): this runs at every greedy step, plain decoding's included."""
    drafted = draft_tokens.tolist() if isinstance(draft_tokens, torch.Tensor) else draft_tokens
    target_tokens = greedy_ids(target_logits)  # k + 1 ids
    k = len(drafted)
    num_accepted = 0
    while num_accepted < k and drafted[num_accepted] == target_tokens[num_accepted]:
        num_accepted += 1
    return Verdict(num_accepted, target_tokens[num_accepted], k)


def verify_positional(
    draft_tokens: Sequence[int],  # [k]
    target_probs: torch.Tensor,  # [k + 1, V] p
    noise: PositionalNoise,  # seen from the output position of draft_tokens[0]
) -> Verdict:
    """The seeded positional rule (module docstring): keep drafted tokens while each equals the target's own
    draw at its position, draw(p_i, u_i); that draw at the first mismatch is the recovered token, after a full
    accept the bonus token. The draft's q is not needed: a draft model couples its draft through the same
    noise. Draws only the rows it needs (one per emitted token), each a float64 cumulative sum of p."""
    k = len(draft_tokens)
    for i, drafted in enumerate(draft_tokens):
        token = draw(target_probs[i], noise.uniform(i))
        if token != drafted:
            return Verdict(i, token, k)  # recovered: what plain decoding emits here
    return Verdict(k, draw(target_probs[k], noise.uniform(k)), k)  # bonus


def verify_sampled(
    draft_tokens: torch.Tensor,  # [k] long
    draft_probs: torch.Tensor | None,  # [k, V] q, or None for a deterministic proposer (one-hot q)
    target_probs: torch.Tensor,  # [k + 1, V] p
    generator: torch.Generator | None,
) -> Verdict:
    """Stochastic: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), in order, until the first
    rejection; there draw the recovered token from normalize(max(0, p_i - q_i)); if none is rejected
    draw the bonus token from p_k."""
    k = draft_tokens.shape[0]
    positions = torch.arange(k)
    p_x = target_probs[positions, draft_tokens]  # [k]
    q_x = draft_probs[positions, draft_tokens] if draft_probs is not None else torch.ones(k)  # [k]
    u = torch.rand(k, generator=generator)  # [k], in [0, 1)
    # u < p/q written without division: q_x > 0 for any token the draft could have drawn.
    num_accepted = _accepted_prefix(u * q_x < p_x)
    if num_accepted == k:
        return Verdict(k, int(sample(target_probs[k], generator)), k)
    return Verdict(
        num_accepted, int(sample(_residual(target_probs, draft_probs, draft_tokens, num_accepted), generator)), k
    )


def _residual(
    target_probs: torch.Tensor,  # [k + 1, V]
    draft_probs: torch.Tensor | None,  # [k, V] or None
    draft_tokens: torch.Tensor,  # [k]
    i: int,
) -> torch.Tensor:  # [V]
    """normalize(max(0, p_i - q_i)): the part of p that the draft under-proposed."""
    p = target_probs[i]
    if draft_probs is None:
        q = torch.zeros_like(p)
        q[draft_tokens[i]] = 1.0
    else:
        q = draft_probs[i]
    residual = torch.clamp(p - q, min=0.0)
    mass = residual.sum()
    if mass <= 0:  # only reachable through rounding when p == q; then p itself is the right law
        return p
    return residual / mass


def _accepted_prefix(passed: torch.Tensor) -> int:
    """Length of the leading run of True in a [k] bool tensor."""
    return int(torch.cumprod(passed.to(torch.int64), dim=0).sum()) if passed.numel() else 0
