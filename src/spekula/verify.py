"""The verifier: rejection sampling as pure functions of tensors (Leviathan et al. 2023, Chen et al. 2023).

Vocabulary (as in vLLM):
- *accepted* tokens: the longest prefix of the draft that passes the test below;
- *recovered* token: at the first rejection, a token drawn from the residual normalize(max(0, p - q));
- *bonus* token: when every drafted token is accepted, a token drawn from p at the position after them.
Every call therefore emits between 1 and k + 1 tokens, and each emitted token is distributed exactly
as the target's p at its position, whatever q is.

Symbols: p = the target's distribution, q = the draft's (both after the same temperature / top-k /
top-p / min-p). A proposer without q (n-gram lookup) is treated as q = one-hot at its token, so
acceptance is min(1, p(x)) and the residual is p with x removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

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
