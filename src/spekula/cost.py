"""The cost model: what a target pass and a draft step cost on this machine, and which k that makes fastest.

Speculation pays only when the tokens it gains outweigh what drafting and a wider verify pass cost,
and both depend on the hardware: a memory-bound target verifies a block of tokens for little more
than the price of one, a compute-bound one pays for every row (docs/BENCHMARKS.md, pass costs;
`scripts/pass_costs.py` measures them). So nothing here assumes a shape: CostModel measures seconds
per target pass for each block width and seconds per draft token, and best_k picks the k that
maximises expected tokens per second

    E[tokens per pass](alpha, k) / (T_target(k + 1) + T_draft(k)),   E = (1 - alpha^(k+1)) / (1 - alpha)

(Leviathan et al. 2023, eq. 1 with i.i.d. acceptance; here with a rate per draft position, see
expected_tokens). k = 0 (plain decoding) is one of the choices. Who asks, and with which
acceptance, is spekula.control's business (one request) or the scheduler's (a batch).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from spekula.config import K_MAX

EMA = 0.2  # weight of a new timing observation
CLASS_EMA = 0.1  # weight of a new acceptance observation in a draft class's engine-wide rates
POSITIONS = 4  # acceptance is learnt for draft positions 1 .. POSITIONS; later ones share the last rate
# calibrate times every verify width up to this one, where the cost curve bends from memory-bound to
# compute-bound (docs/BENCHMARKS.md, pass costs), and every 4th past it
DENSE_WIDTHS = 9


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
    not flat: once the first token of an n-gram draft after a short match is accepted, the match is
    one token longer, and later tokens are accepted more often (docs/BENCHMARKS.md, acceptance by
    draft class; `scripts/experiments/ngram_replay.py --by-class` measures it).
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
        """Seconds for a target pass over n tokens: measured, or interpolated between measured widths."""
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
        """Expected tokens per second of one sequence drafting k tokens a step at this acceptance."""
        return expected_tokens(alpha, k) / (self.target_cost(k + 1) + k * self.draft_s_per_token)

    def best_k(self, alpha: float | Sequence[float], k_max: int) -> tuple[int, float]:
        """(k, predicted speedup over plain decoding) maximising expected tokens per second of one
        sequence: best_batch_k with a batch of one."""
        return self.best_batch_k([alpha], k_max)

    def best_batch_k(self, alphas: Sequence[float | Sequence[float]], k_max: int) -> tuple[int, float]:
        """One k for every sequence of a pass: (k, predicted speedup over plain decoding).

        alphas: each sequence's expected acceptance (a rate, or rates by draft position). A pass over
        B sequences verifies B (k + 1) rows. On a CPU wide passes turn compute-bound, so the batch's
        own plain pass (B rows) gets cheap per token and speculation pays less as B grows:

            rate(k) = sum_i E(alpha_i, k) / (T_target(B (k + 1)) + B k T_draft)    (drafts run one by one)

        Ties go to the longer draft. With one sequence this is tokens_per_s, maximised.

        The rule is the same for one request and for a batch; what differs is the acceptance each
        passes in. A lone request (AdaptiveK.choose_k) chooses k for the one draft it is about to
        make, and its proposer has already said how promising that draft is: so it passes the rates
        of that draft class, by position, scaled by the request's own evidence. A batching scheduler
        chooses one k for every sequence of the round before any of them drafts (Generation.plan
        takes the round's k as given, then asks the proposer for its draft class), and their next
        drafts are of different classes; so it passes each request's running alpha over all its
        drafts (AdaptiveK.alpha): how many tokens the request adds per pass on average. Slow start,
        the catch-up check and probes guard one request's bet and have no part in a shared k.
        """
        B = len(alphas)

        def rate(k: int) -> float:
            drafting_s = B * k * self.draft_s_per_token
            return sum(expected_tokens(a, k) for a in alphas) / (self.target_cost(B * (k + 1)) + drafting_s)

        best, k = max((rate(k), k) for k in range(k_max + 1))
        return k, best / rate(0)

    def calibrate(
        self, target, draft=None, k_max: int = K_MAX, context: int = 64, repeats: int = 2, max_rows: int = 0,
    ) -> None:
        """Time target passes of up to k_max + 1 tokens (and one draft token) on a warm cache: every
        width up to DENSE_WIDTHS (where the cost curve bends: memory-bound, then compute-bound), `repeats`
        times, and every 4th past it and k_max + 1 itself once; target_cost interpolates between them.

        max_rows: a batching server's widest pass (max batch x (k_max + 1)); widths past k_max + 1 are
        then timed at powers of two up to it, once each, for best_batch_k.
        """
        # online passes refine the widths timed once
        widths = [(n, repeats if n <= DENSE_WIDTHS else 1) for n in calibration_widths(k_max)]
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
