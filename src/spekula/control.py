"""How many tokens to draft: the controller and its cost model.

Speculation pays only when the tokens it gains outweigh what drafting and a wider verify pass cost,
and both depend on the hardware: a memory-bound target (bf16 on CPU) verifies 9 tokens for about the
price of 1, a compute-bound one (llama.cpp Q4 on 2 cores) pays ~4x for 5. So nothing here assumes a
shape: the CostModel measures seconds per target pass for each block width and seconds per draft
token, and the controller picks the k that maximises expected tokens per second

    E[tokens per pass](alpha, k) / (T_target(k + 1) + T_draft(k)),   E = (1 - alpha^(k+1)) / (1 - alpha)

(Leviathan et al. 2023, eq. 1 with i.i.d. acceptance; here with a rate per draft position, see
expected_tokens). k = 0 (plain decoding) is one of the choices;
when it wins, the controller decodes plainly and probes with a short draft every few steps, so a
request whose text turns predictable gets speculation back.

Acceptance is learnt per *draft class* where the proposer can tell, before drafting, how promising
its next draft is (Proposer.draft_class): n-gram lookup's drafts after a 4-token match are accepted
~89% of the time on the built-in suite, after a 1-token match ~28%, so one alpha for both would bet
on the weak matches and hold back on the strong ones.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from spekula.config import K_MAX

EMA = 0.2  # weight of a new timing observation
CLASS_EMA = 0.1  # weight of a new acceptance observation in a draft class's engine-wide rates
POSITIONS = 4  # acceptance is learnt for draft positions 1 .. POSITIONS; later ones share the last rate
NO_DRAFT = "no draft"  # a draft class: the proposer has nothing to offer now (k = 0, not a decision)
DENSE_WIDTHS = 9  # calibration times every verify width up to this one (where the cost curve bends), every 4th past it


class Controller(ABC):
    """One per request: chooses k before each step and learns from the outcome."""

    predicted_speedup: float | None = None  # of the last choice, vs plain decoding

    @abstractmethod
    def choose_k(self, remaining: int | None = None, catch_up: int = 0, draft_class: str | None = None) -> int:
        """k for the next step. remaining: tokens the request may still emit (None: unknown);
        catch_up: context tokens the draft must process before its first draft (a cold draft cache);
        draft_class: what the proposer knows of its next draft (Proposer.draft_class; NO_DRAFT: it
        has none to offer, so k = 0)."""

    def observe(
        self, k: int, num_drafted: int, num_accepted: int, draft_s: float, score_s: float | None,
        catch_up: int = 0, draft_class: str | None = None,
    ) -> None:
        """Outcome of one step: what was drafted and accepted, and what the draft and the verify pass
        cost (score_s None: the pass ran inside a batch, so its time is not this request's).
        catch_up: context tokens the draft processed first, inside draft_s (a cold draft's prefill);
        draft_class: the class choose_k was given for this step."""


@dataclass
class FixedK(Controller):
    k: int

    def choose_k(self, remaining: int | None = None, catch_up: int = 0, draft_class: str | None = None) -> int:
        return 0 if draft_class == NO_DRAFT else self.k


def expected_tokens(alpha: float | Sequence[float], k: int) -> float:
    """Mean tokens emitted by one pass that verifies k drafts. alpha: the chance each draft token is
    accepted, or per draft position i, the chance it is accepted given every earlier one was (the
    last rate holds for later positions)."""
    if k == 0:
        return 1.0
    if not isinstance(alpha, Sequence):
        if alpha >= 1.0:
            return k + 1.0
        return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= alpha[min(i, len(alpha) - 1)]
        total += reach
    return total


@dataclass
class CostModel:
    """Measured costs on this machine, shared by the requests of one engine.

    target_s[n]: seconds for one target pass over n tokens (EMA of observations); widths never
    measured are interpolated linearly between measured ones (extrapolated with the last slope).
    draft_s_per_token: seconds per drafted token (draft forward, or n-gram lookup ~ 0).
    alpha: running acceptance rate over all requests, the prior for a new request.
    acceptance: per draft class (Proposer.draft_class), the running chance that draft position i is
    accepted given every earlier one was, for i < POSITIONS: the prior for a class's drafts. It is
    not flat: an n-gram draft after a 1-token match has its first token accepted ~28% of the time,
    but once that is, the match is 2 tokens long, and later tokens are accepted more often.
    """

    target_s: dict[int, float] = field(default_factory=dict)
    draft_s_per_token: float = 0.0
    draft_prefill_s_per_token: float = 0.0  # a cold draft's catch-up on the context, per token
    alpha: float = 0.6
    acceptance: dict[str | None, list[float | None]] = field(default_factory=dict)  # None: not reached yet
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

    def observe_acceptance(self, num_drafted: int, num_accepted: int, draft_class: str | None = None) -> None:
        """One step's outcome: the first num_accepted of num_drafted draft tokens were accepted."""
        rejected = 1 if num_accepted < num_drafted else 0
        rates = self.acceptance.setdefault(draft_class, [None] * POSITIONS)
        for i in range(num_accepted + rejected):
            j = min(i, POSITIONS - 1)
            old = rates[j] if rates[j] is not None else self.prior_acceptance(draft_class)[j]  # as updated so far
            rates[j] = (1 - CLASS_EMA) * old + CLASS_EMA * (i < num_accepted)
        self.alpha = (1 - EMA) * self.alpha + EMA * num_accepted / (num_accepted + rejected)

    def prior_acceptance(self, draft_class: str | None = None) -> list[float]:
        """What a draft of this class is expected to get, by position, before a request has evidence.
        A position no draft of the class has reached yet is expected to do as the one before it."""
        rates, last = [], self.alpha
        for rate in self.acceptance.get(draft_class, [None] * POSITIONS):
            last = rate if rate is not None else last
            rates.append(last)
        return rates

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

    def tokens_per_s(self, alpha: float | Sequence[float], k: int) -> float:
        return expected_tokens(alpha, k) / (self.target_cost(k + 1) + k * self.draft_s_per_token)

    def best_k(self, alpha: float | Sequence[float], k_max: int) -> tuple[int, float]:
        """(k, predicted speedup over plain decoding) maximising expected tokens per second."""
        plain = self.tokens_per_s(alpha, 0)
        rates = [(self.tokens_per_s(alpha, k), k) for k in range(k_max + 1)]
        rate, k = max(rates)
        return k, rate / plain

    def best_batch_k(self, alphas: list[float], k_max: int) -> tuple[int, float]:
        """One k for every sequence of a batched pass: (k, predicted speedup over plain decoding).

        A pass over B sequences verifies B (k + 1) rows. On a CPU wide passes turn compute-bound, so
        the batch's own plain pass (B rows) gets cheap per token and speculation pays less as B grows:

            rate(k) = sum_i E(alpha_i, k) / (T_target(B (k + 1)) + B k T_draft)    (drafts run one by one)

        With one sequence this is best_k.
        """
        B = len(alphas)

        def rate(k: int) -> float:
            return sum(expected_tokens(a, k) for a in alphas) / (self.target_cost(B * (k + 1)) + B * k * self.draft_s_per_token)

        best, k = max((rate(k), k) for k in range(k_max + 1))
        return k, best / rate(0)

    def calibrate(self, target, draft=None, k_max: int = K_MAX, context: int = 64, repeats: int = 2, max_rows: int = 0) -> None:
        """Time target passes of up to k_max + 1 tokens (and one draft token) on a warm cache: every
        width up to DENSE_WIDTHS (where the cost curve bends: memory-bound, then compute-bound), `repeats` times,
        and every 4th past it and k_max + 1 itself once; target_cost interpolates between them.

        max_rows: a batching server's widest pass (max batch x (k_max + 1)); widths past k_max + 1 are
        then timed at powers of two up to it, once each, for best_batch_k.
        """
        widths = [(n, repeats if n <= DENSE_WIDTHS else 1) for n in calibration_widths(k_max)]  # online passes refine the rest
        wide, n = [], 16
        while n <= k_max + 1:
            n *= 2
        while max_rows > k_max + 1 and n < max_rows:
            wide.append(n)
            n *= 2
        widths += [(n, 1) for n in wide + ([max_rows] if max_rows > k_max + 1 else [])]
        prefix = list(range(100, 100 + context))
        seq = target.new_sequence()
        seq.forward(prefix, num_logits=1)
        for n, times in widths:
            block = [(100 + i) % target.vocab_size for i in range(n)]  # any ids: only the time counts
            for _ in range(times):
                start = time.perf_counter()
                seq.forward(block, num_logits=n)
                self.observe_target(n, time.perf_counter() - start)
                seq.truncate(context)
        seq.release()
        if draft is not None:
            dseq = draft.new_sequence()
            start = time.perf_counter()
            dseq.forward(prefix, num_logits=1)
            self.draft_prefill_s_per_token = (time.perf_counter() - start) / len(prefix)
            for _ in range(repeats + 1):
                start = time.perf_counter()
                dseq.forward(prefix[:1], num_logits=1)
                self.observe_draft(1, time.perf_counter() - start)
                dseq.truncate(context)
            dseq.release()


def calibration_widths(k_max: int) -> list[int]:
    """The verify-pass widths calibrate times for drafts of up to k_max tokens."""
    last = k_max + 1
    return sorted({*range(1, min(last, DENSE_WIDTHS) + 1), *range(DENSE_WIDTHS + 4, last, 4), last})


@dataclass
class AdaptiveK(Controller):
    """--k auto: the k the cost model predicts is fastest for this request's expected acceptance."""

    costs: CostModel
    k_max: int = K_MAX
    probe_every: int = 8  # plain steps before the first probe while speculation does not pay (at least)
    probe_budget: float = 0.02  # ... and probes may cost at most this fraction of plain decoding's time
    max_probe_every: int = 128  # ... doubling after every probe that changes nothing
    min_probe_gain: float = 1.2  # probe only where perfect acceptance would beat plain decoding by this much
    prior_weight: float = 2.0  # pseudo-observations of the engine-wide rates, against this request's own
    decay: float = 0.9  # older steps count less: acceptance drifts with the text
    # This request's accepted draft tokens and rejected drafts, and how many of each the engine-wide
    # rates expected (decayed sums over every class and position): how much likelier than usual
    # its drafts pass.
    _accepted: float = 0.0
    _rejected: float = 0.0
    _expected_accepted: float = 0.0
    _expected_rejected: float = 0.0
    _plain_steps: int = 0
    _probe_gap: int = 0
    _k_cap: int | None = None  # slow start: the longest draft this request may risk yet (None: not set)

    @property
    def alpha(self) -> float:
        """This request's running acceptance rate, all draft classes and positions together."""
        prior = self.prior_weight
        return (self._accepted + prior * self.costs.alpha) / (self._accepted + self._rejected + prior)

    def acceptance(self, draft_class: str | None = None) -> list[float]:
        """Expected acceptance of a draft of this class, by position: the engine-wide rates for the
        class, with their odds scaled by this request's own evidence. Requests differ from each
        other more than a class's rates do (a JSON extraction copies its prompt after a 1-token
        match far more often than a chat reply does), and one factor for all of a request's
        classes learns that from every draft it has verified, whichever class they were."""
        w = self.prior_weight
        odds = ((self._accepted + w) / (self._expected_accepted + w)) / ((self._rejected + w) / (self._expected_rejected + w))
        return [p * odds / (1.0 - p + p * odds) for p in self.costs.prior_acceptance(draft_class)]

    def choose_k(self, remaining: int | None = None, catch_up: int = 0, draft_class: str | None = None) -> int:
        if draft_class == NO_DRAFT:
            self.predicted_speedup = 1.0
            return 0
        alpha = self.acceptance(draft_class)
        k, self.predicted_speedup = self.costs.best_k(alpha, self.k_cap)
        if k > 0 and not self._pays_back(alpha, k, remaining, catch_up):
            k, self.predicted_speedup = 0, 1.0
        if k > 0:
            self._plain_steps, self._probe_gap = 0, self.first_probe_gap
            return k
        if self.costs.best_k(1.0, self.k_max)[1] < self.min_probe_gain:
            # Even perfect acceptance would (barely) not pay on this hardware: no probe can change
            # that, and a probe has costs the per-token model leaves out (the draft catching up).
            return 0
        self._probe_gap = self._probe_gap or self.first_probe_gap
        self._plain_steps += 1
        if self._plain_steps < self._probe_gap:
            return 0
        if remaining is not None and remaining < self._probe_gap:
            return 0  # too few tokens left to win back what a probe costs, even if acceptance came back
        if catch_up:
            # A probe of a cold draft pays its catch-up first, so it must be won back at the
            # acceptance requests here usually get (the engine-wide alpha), not at a perfect one.
            usual = self.costs.alpha
            k_usual = self.costs.best_k(usual, self.k_max)[0]
            if k_usual == 0 or not self._pays_back(usual, k_usual, remaining, catch_up):
                return 0
        # Probe: one drafted token tells us whether acceptance came back. Each probe costs a wider
        # pass and a draft step, so probes that change nothing come ever less often.
        self._plain_steps = 0
        self._probe_gap = min(2 * self._probe_gap, self.max_probe_every)
        return 1

    @property
    def first_probe_gap(self) -> int:
        """Plain steps before a probe: probe_every, or more where a probe's wider pass is dear. A
        probe that finds nothing costs T(2) + T_draft - T(1); one every g plain steps costs that
        over g T(1), which probe_budget bounds. (Packed fp32: 3-10% of a pass, so every 8 steps;
        transformers' fp32: a whole pass, so every ~52; llama.cpp Q4: ~45%, so every ~23.)"""
        c = self.costs
        extra = c.target_cost(2) + c.draft_s_per_token - c.target_cost(1)
        return max(self.probe_every, math.ceil(extra / (self.probe_budget * c.target_cost(1))))

    @property
    def k_cap(self) -> int:
        """Slow start. A new request's alpha is only the engine-wide prior, learnt on other requests,
        and n-gram acceptance in particular differs from prompt to prompt. So until a request has
        evidence of its own, a fully rejected draft may cost it at most one plain pass more than
        plain decoding: k <= the largest k with T(k + 1) + k T_draft <= 2 T(1). Each fully accepted
        draft doubles the cap, up to k_max. Where verification and drafts are cheap (packed fp32
        weights, n-gram lookup) the cap starts at or near k_max and changes little; a draft model's
        own steps count against it, so its cap starts lower; where a wide pass is dear
        (transformers' fp32, llama.cpp on 2 cores) a wrong prior costs one short draft instead of a
        long one."""
        if self._k_cap is None:
            c = self.costs
            plain = c.target_cost(1)
            fits = [k for k in range(1, self.k_max + 1) if c.target_cost(k + 1) + k * c.draft_s_per_token <= 2 * plain]
            self._k_cap = max(fits, default=1)
        return self._k_cap

    def _pays_back(self, alpha: float | Sequence[float], k: int, remaining: int | None, catch_up: int) -> bool:
        """Would the seconds speculation saves over the remaining tokens (at this alpha and k) cover
        the draft's catch-up prefill first? Only a cold draft has one, and only then is it asked."""
        if not catch_up or remaining is None or k == 0:
            return True
        c = self.costs
        saved_per_token = c.target_cost(1) - 1.0 / c.tokens_per_s(alpha, k)
        return remaining * saved_per_token > catch_up * c.draft_prefill_s_per_token

    def observe(
        self, k: int, num_drafted: int, num_accepted: int, draft_s: float, score_s: float | None,
        catch_up: int = 0, draft_class: str | None = None,
    ) -> None:
        if score_s is not None:
            self.costs.observe_target(num_drafted + 1, score_s)
        if num_drafted:
            if catch_up <= 1:  # else draft_s is mostly the draft's prefill: not a price per drafted token
                self.costs.observe_draft(num_drafted, draft_s)
            rejected = 1.0 if num_accepted < num_drafted else 0.0
            if not rejected:
                self._k_cap = min(2 * self.k_cap, self.k_max)
            prior = self.costs.prior_acceptance(draft_class)
            tried = [prior[min(i, POSITIONS - 1)] for i in range(int(num_accepted + rejected))]
            self._accepted = self.decay * self._accepted + num_accepted
            self._rejected = self.decay * self._rejected + rejected
            self._expected_accepted = self.decay * self._expected_accepted + sum(tried)
            self._expected_rejected = self.decay * self._expected_rejected + sum(1.0 - p for p in tried)
            self.costs.observe_acceptance(num_drafted, num_accepted, draft_class)
