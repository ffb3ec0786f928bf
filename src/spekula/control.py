"""How many tokens to draft: the controller and its cost model.

Speculation pays only when the tokens it gains outweigh what drafting and a wider verify pass cost,
and both depend on the hardware: a memory-bound target (bf16 on CPU) verifies 9 tokens for about the
price of 1, a compute-bound one (llama.cpp Q4 on 2 cores) pays ~4x for 5. So nothing here assumes a
shape: the CostModel measures seconds per target pass for each block width and seconds per draft
token, and the controller picks the k that maximises expected tokens per second

    E[tokens per pass](alpha, k) / (T_target(k + 1) + T_draft(k)),   E = (1 - alpha^(k+1)) / (1 - alpha)

(Leviathan et al. 2023, eq. 1 with i.i.d. acceptance). k = 0 (plain decoding) is one of the choices;
when it wins, the controller decodes plainly and probes with a short draft every few steps, so a
request whose text turns predictable gets speculation back.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

EMA = 0.2  # weight of a new timing observation


class Controller(ABC):
    """One per request: chooses k before each step and learns from the outcome."""

    predicted_speedup: float | None = None  # of the last choice, vs plain decoding

    @abstractmethod
    def choose_k(self) -> int: ...

    def observe(self, k: int, num_drafted: int, num_accepted: int, draft_s: float, score_s: float) -> None:
        """Outcome of one step: what was drafted and accepted, and what the draft and the verify pass cost."""


@dataclass
class FixedK(Controller):
    k: int

    def choose_k(self) -> int:
        return self.k


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens emitted by one pass that verifies k drafts, each accepted with probability alpha."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class CostModel:
    """Measured costs on this machine, shared by the requests of one engine.

    target_s[n]: seconds for one target pass over n tokens (EMA of observations); widths never
    measured are interpolated linearly between measured ones (extrapolated with the last slope).
    draft_s_per_token: seconds per drafted token (draft forward, or n-gram lookup ~ 0).
    alpha: running acceptance rate over all requests, the prior for a new request.
    """

    target_s: dict[int, float] = field(default_factory=dict)
    draft_s_per_token: float = 0.0
    alpha: float = 0.6
    frozen: bool = False  # ignore timing observations (given costs, e.g. from `spekula tune`, or tests)

    def observe_target(self, n: int, seconds: float) -> None:
        if self.frozen:
            return
        old = self.target_s.get(n)
        self.target_s[n] = seconds if old is None else (1 - EMA) * old + EMA * seconds

    def observe_draft(self, tokens: int, seconds: float) -> None:
        if self.frozen:
            return
        per = seconds / tokens
        self.draft_s_per_token = (1 - EMA) * self.draft_s_per_token + EMA * per if self.draft_s_per_token else per

    def target_cost(self, n: int) -> float:
        if n in self.target_s:
            return self.target_s[n]
        known = sorted(self.target_s)
        if not known:
            raise ValueError("the cost model has no measurement yet; call calibrate() first")
        if len(known) == 1:
            return self.target_s[known[0]]
        lo = max([m for m in known if m < n], default=None)
        hi = min([m for m in known if m > n], default=None)
        if lo is None:
            lo, hi = known[0], known[1]
        elif hi is None:
            lo, hi = known[-2], known[-1]
        slope = (self.target_s[hi] - self.target_s[lo]) / (hi - lo)
        return max(self.target_s[lo] + slope * (n - lo), 1e-9)

    def tokens_per_s(self, alpha: float, k: int) -> float:
        return expected_tokens(alpha, k) / (self.target_cost(k + 1) + k * self.draft_s_per_token)

    def best_k(self, alpha: float, k_max: int) -> tuple[int, float]:
        """(k, predicted speedup over plain decoding) maximising expected tokens per second."""
        plain = self.tokens_per_s(alpha, 0)
        rates = [(self.tokens_per_s(alpha, k), k) for k in range(k_max + 1)]
        rate, k = max(rates)
        return k, rate / plain

    def calibrate(self, target, draft=None, k_max: int = 8, context: int = 64, repeats: int = 2) -> None:
        """Time target passes of 1 .. k_max + 1 tokens (and one draft token) on a warm cache."""
        prefix = list(range(100, 100 + context))
        seq = target.new_sequence()
        seq.forward(prefix, num_logits=1)
        for n in range(1, k_max + 2):
            for _ in range(repeats):
                start = time.perf_counter()
                seq.forward(prefix[:n], num_logits=n)
                self.observe_target(n, time.perf_counter() - start)
                seq.truncate(context)
        seq.release()
        if draft is not None:
            dseq = draft.new_sequence()
            dseq.forward(prefix, num_logits=1)
            for _ in range(repeats + 1):
                start = time.perf_counter()
                dseq.forward(prefix[:1], num_logits=1)
                self.observe_draft(1, time.perf_counter() - start)
                dseq.truncate(context)
            dseq.release()


@dataclass
class AdaptiveK(Controller):
    """--k auto: the k the cost model predicts is fastest for this request's running alpha."""

    costs: CostModel
    k_max: int = 8
    probe_every: int = 8  # plain steps before the first probe while speculation does not pay
    max_probe_every: int = 128  # ... doubling after every probe that changes nothing
    prior_weight: float = 2.0  # pseudo-observations of the engine-wide alpha
    decay: float = 0.9  # older steps count less: acceptance drifts with the text
    _accepted: float = 0.0
    _rejected: float = 0.0
    _plain_steps: int = 0
    _probe_gap: int = 0

    @property
    def alpha(self) -> float:
        prior = self.prior_weight
        return (self._accepted + prior * self.costs.alpha) / (self._accepted + self._rejected + prior)

    def choose_k(self) -> int:
        k, self.predicted_speedup = self.costs.best_k(self.alpha, self.k_max)
        if k > 0:
            self._plain_steps, self._probe_gap = 0, self.probe_every
            return k
        if self.costs.best_k(1.0, self.k_max)[0] == 0:
            return 0  # even perfect acceptance would not pay on this hardware: no probe can change that
        self._probe_gap = self._probe_gap or self.probe_every
        self._plain_steps += 1
        if self._plain_steps < self._probe_gap:
            return 0
        # Probe: one drafted token tells us whether acceptance came back. Each probe costs a wider
        # pass and a draft step, so probes that change nothing come ever less often.
        self._plain_steps = 0
        self._probe_gap = min(2 * self._probe_gap, self.max_probe_every)
        return 1

    def observe(self, k: int, num_drafted: int, num_accepted: int, draft_s: float, score_s: float) -> None:
        self.costs.observe_target(num_drafted + 1, score_s)
        if num_drafted:
            self.costs.observe_draft(num_drafted, draft_s)
            rejected = 1.0 if num_accepted < num_drafted else 0.0
            self._accepted = self.decay * self._accepted + num_accepted
            self._rejected = self.decay * self._rejected + rejected
            rate = num_accepted / (num_accepted + rejected)
            self.costs.alpha = (1 - EMA) * self.costs.alpha + EMA * rate
