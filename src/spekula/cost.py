"""The cost model: what a target pass and a draft step cost on this machine, and which k that makes fastest.

Speculation pays only when the tokens it gains outweigh what drafting and a wider verify pass cost,
and both depend on the hardware: a memory-bound target verifies a block of tokens for little more
than the price of one, a compute-bound one pays for every row (docs/BENCHMARKS.md, "Pass costs by width";
`scripts/pass_costs.py` measures them). So nothing here assumes a shape: CostModel measures seconds
per target pass for each block width and seconds per draft token, and best_k picks the k that
maximises expected tokens per second

    E[tokens per pass](alpha, k) / (T_target(k + 1) + T_draft(k)),   E = (1 - alpha^(k+1)) / (1 - alpha)

(Leviathan et al. 2023, eq. 1 with i.i.d. acceptance; here with a rate per draft position, see
expected_tokens). k = 0 (plain decoding) is one of the choices. Who asks, and with which
acceptance, is spekula.control's business (one request) or the scheduler's (a batch).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from spekula.config import K_MAX
from spekula.draft_class import DraftClass

EMA = 0.2  # weight of a new timing observation
CLASS_EMA = 0.1  # weight of a new acceptance observation in a draft class's engine-wide rates
POSITIONS = 4  # acceptance is learnt for draft positions 1 .. POSITIONS; later ones share the last rate
PRIOR_ALPHA = 0.6  # the engine-wide alpha before any evidence, and where it returns to without any
# Engine-wide acceptance is a prior, not a verdict: every learnt rate relaxes back towards its base
# (PRIOR_ALPHA, or a class's base_acceptance) with this half-life in engine steps, so what one unlucky
# request taught does not switch a proposer off for the life of a process.
HALF_LIFE = 512
RELAX_PER_STEP = 1.0 - 0.5 ** (1.0 / HALF_LIFE)  # the share of the way back one step goes
# calibrate times every verify width up to this one, where the cost curve bends from memory-bound to
# compute-bound (docs/BENCHMARKS.md, "Pass costs by width"); past it every width where that costs little (see
# calibrate), else the widths where a kernel that works in groups of rows changes slope: 4j and 4j + 1
# (llama.cpp's repacked kernels: a pass of 16 rows is far cheaper than one of 17)
DENSE_WIDTHS = 9
ROW_GROUP = 4
# The table no longer describes the machine when a one-token pass observed online differs from its
# calibrated time by more than this fraction (calibration ran while the machine was busy, or it got
# busy since): every width follows the drift (CostModel) until they are re-measured.
DRIFT = 0.3
# Engine steps between two re-measurements at least, doubling after each: a drift that measuring again
# does not remove (the context grew, and with it every pass) must not cost a calibration every few requests.
RECALIBRATE_GAP = 256


def base_acceptance(draft_class: DraftClass | None) -> list[float] | None:
    """What a draft after a match of m tokens is expected to get by position, before any evidence:
    m / (m + 2) at the first position (Laplace's rule of succession after m matching tokens and one
    miss), and at position i as if the match were i tokens longer, since an accepted token lengthens
    it. A long match is itself evidence that text is being copied; a 1-token match is weak. None: the
    class names no match length (a draft model), and the engine-wide alpha stands in."""
    base = _base(draft_class)
    return None if base is None else list(base)


@functools.lru_cache(maxsize=1024)  # read for every class at every step (CostModel.tick)
def _base(draft_class: DraftClass | None) -> tuple[float, ...] | None:
    """base_acceptance, as a tuple nobody can change."""
    m = None if draft_class is None else draft_class.length
    if m is None:
        return None
    return tuple((m + i) / (m + i + 2) for i in range(POSITIONS))


def expected_tokens(alpha: float | Sequence[float], k: int) -> float:
    """Mean tokens emitted by one pass that verifies k drafts. alpha: the chance each draft token is
    accepted, or per draft position i, the chance it is accepted given every earlier one was (the
    last rate holds for later positions)."""
    if k == 0:
        return 1.0
    rates = _by_position(alpha)
    if rates is None:
        rate = cast(float, alpha)  # _by_position: one rate for all
        if rate >= 1.0:
            return k + 1.0
        return (1.0 - rate ** (k + 1)) / (1.0 - rate)
    total, reach, last = 1.0, 1.0, len(rates) - 1
    for i in range(k):
        reach *= rates[min(i, last)]
        total += reach
    return total


def _rate(alpha: float | Sequence[float], i: int) -> float:
    """The chance draft position i (from 0) is accepted given every earlier one was (expected_tokens' alpha)."""
    rates = _by_position(alpha)
    return cast(float, alpha) if rates is None else rates[min(i, len(rates) - 1)]


def _by_position(alpha: float | Sequence[float]) -> Sequence[float] | None:
    """alpha's rates by draft position, or None for one rate for all. The controller asks with a list at every
    step, several times: lists, tuples and numbers are told apart without the (slow) abstract Sequence check."""
    if isinstance(alpha, (list, tuple)):
        return alpha
    if isinstance(alpha, (float, int)):
        return None
    return alpha if isinstance(alpha, Sequence) else None


@dataclass
class CostModel:
    """Measured costs on this machine, shared by the requests of one engine.

    target_s[n]: seconds for one target pass over n tokens (EMA of observations); widths never
    measured are interpolated linearly between measured ones (extrapolated with the last slope).
    calibrated: target_s as calibrate left it. The machine's speed drifts (other work, a busy
    calibration: docs/decisions/0004-pass-costs-follow-the-machine.md), and plain steps observe only the
    one-token pass, so its drift from its calibrated time stands for the machine's: a width not observed
    online since calibrate is scaled by it, and a width observed online by how far it moved since that
    width was last observed. A width timed while the machine was slow then does not look dear once it is
    fast again, which would keep the controller off it (and so from ever observing it again). stale()
    says when the table should be measured again. Change target_s through observe_target and
    calibrate, or assign a new table: the costs derived from it (target_cost) are kept until then.
    draft_s_per_token: seconds per drafted token (draft forward, or n-gram lookup ~ 0).
    alpha: running acceptance rate over all requests, the prior for a new request.
    acceptance: per draft class (Proposer.draft_class), the running chance that draft position i is
    accepted given every earlier one was, for i < POSITIONS: the prior for a class's drafts. It is
    not flat: once the first token of an n-gram draft after a short match is accepted, the match is
    one token longer, and later tokens are accepted more often (`scripts/experiments/ngram_replay.py
    --by-class` measures it). A class never observed starts from base_acceptance (its match length),
    and every rate, alpha included, relaxes back towards its base with HALF_LIFE engine steps (tick).
    """

    target_s: dict[int, float] = field(default_factory=dict)
    draft_s_per_token: float = 0.0
    draft_prefill_s_per_token: float = 0.0  # a cold draft's catch-up on the context, per token
    alpha: float = PRIOR_ALPHA
    acceptance: dict[DraftClass | None, list[float | None]] = field(default_factory=dict)  # None: not reached yet
    frozen: bool = False  # ignore timing observations (given costs, e.g. from `spekula tune`, or tests)
    calibrated: dict[int, float] = field(default_factory=dict)  # target_s as calibrate left it
    steps: int = field(default=0, init=False)  # engine steps so far (tick): the clock priors relax by
    _online: set[int] = field(default_factory=set, init=False, repr=False)  # widths observed since calibrate
    _calibrated_at: int | None = field(default=None, init=False, repr=False)  # steps at the last calibrate
    _recalibrations: int = field(default=0, init=False, repr=False)
    # target_cost(n) for n = 0 .. len - 1 (0 unused), as the table stands: the controller searches it several
    # times a step, and plain steps change it at every step (the one-token pass), so it is built once for all of
    # them. Emptied whenever the table changes (_forget_costs).
    _costs: list[float] = field(default_factory=list, init=False, repr=False, compare=False)
    _measured: list[tuple[int, float]] = field(default_factory=list, init=False, repr=False, compare=False)
    # Per width observed online since calibrate (past one token): the drift when it was last observed.
    _drift_at: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        if name in _TABLES:  # a table assigned whole (tests, given costs): what was derived from the old one goes
            self._forget_costs()

    def _forget_costs(self) -> None:
        object.__setattr__(self, "_costs", [])

    def observe_target(self, n: int, seconds: float) -> None:
        if self.frozen:
            return
        old = self.target_s.get(n)
        if old is not None:
            old = self._seconds_now(n, old)  # as the drift since it was last observed (or calibrated) scaled it
        self.target_s[n] = seconds if old is None else (1 - EMA) * old + EMA * seconds
        self._online.add(n)
        self._forget_costs()
        if n > 1 and self.calibrated.get(1):
            self._drift_at[n] = self.drift

    def _seconds_now(self, n: int, seconds: float) -> float:
        """A measured width's seconds (target_s[n]) as the table stands now (see the class's docstring)."""
        if not self.calibrated.get(1):
            return seconds
        if n in self._drift_at:
            return seconds * self.drift / self._drift_at[n]
        return seconds if n in self._online else seconds * self.drift

    @property
    def drift(self) -> float:
        """One-token pass time observed online / its calibrated time (1.0 until both exist)."""
        if 1 not in self._online or not self.calibrated.get(1):
            return 1.0
        return self.target_s[1] / self.calibrated[1]

    def stale(self) -> bool:
        """Should the pass costs be measured again? When the one-token pass observed online drifted
        from its calibrated time by more than DRIFT (either way), and RECALIBRATE_GAP engine steps have
        passed since the last calibration (twice that after each re-measurement). Until then
        target_cost scales every width by the drift (see the class)."""
        if self.frozen or not self.calibrated or self._calibrated_at is None:
            return False
        if self.steps - self._calibrated_at < RECALIBRATE_GAP * 2**self._recalibrations:
            return False
        return abs(math.log(self.drift)) > math.log(1.0 + DRIFT)

    def tick(self) -> None:
        """One engine step has passed: every learnt acceptance rate relaxes towards its base (HALF_LIFE)."""
        self.steps += 1
        relax = RELAX_PER_STEP
        self.alpha += (PRIOR_ALPHA - self.alpha) * relax
        for draft_class, rates in self.acceptance.items():
            base = _base(draft_class) or _PRIOR_RATES
            for i, rate in enumerate(rates):
                if rate is not None:
                    rates[i] = rate + (base[i] - rate) * relax

    def observe_draft(self, tokens: int, seconds: float) -> None:
        if self.frozen:
            return
        per = seconds / tokens
        self.draft_s_per_token = (1 - EMA) * self.draft_s_per_token + EMA * per if self.draft_s_per_token else per

    def observe_acceptance(
        self, num_drafted: int, num_accepted: int, draft_class: DraftClass | None = None, weight: float = 1.0
    ) -> None:
        """One step's outcome: the first num_accepted of num_drafted draft tokens were accepted. weight: how much
        it counts towards the rates, the class's and alpha (1.0: a whole step; AdaptiveK gives a request's n-th
        draft of a class 1/n, so that the rates are those of a request's first drafts)."""
        rejected = 1 if num_accepted < num_drafted else 0
        rates = self.acceptance.setdefault(draft_class, [None] * POSITIONS)
        step = CLASS_EMA * weight
        for i in range(num_accepted + rejected):
            j = min(i, POSITIONS - 1)
            rate = rates[j]
            old = rate if rate is not None else self.prior_acceptance(draft_class)[j]  # as updated so far
            rates[j] = (1 - step) * old + step * (i < num_accepted)
        self.alpha = (1 - EMA * weight) * self.alpha + EMA * weight * num_accepted / (num_accepted + rejected)

    def prior_acceptance(self, draft_class: DraftClass | None = None) -> list[float]:
        """What a draft of this class is expected to get, by position, before a request has evidence:
        the class's learnt rates; where it has none, its base_acceptance (its match length), else, for
        a class that names no match length, what the position before it gets (alpha at the first).
        A class with a match length never expects less at a position than at the one before: each
        accepted token lengthens the match (so a rate learnt at the first position carries to later
        ones that short drafts never reach)."""
        rates, last = [], self.alpha
        base = _base(draft_class)
        for i, rate in enumerate(self.acceptance.get(draft_class, [None] * POSITIONS)):
            if base is None:
                last = rate if rate is not None else last
            else:
                last = max(rate if rate is not None else base[i], last if i else 0.0)
            rates.append(last)
        return rates

    def target_cost(self, n: int) -> float:
        """Seconds for a target pass over n tokens: measured, or interpolated between measured widths."""
        costs = self._costs
        if n < len(costs):
            return costs[n]
        return self._costs_up_to(n)[n]

    def _costs_up_to(self, n: int) -> list[float]:
        """target_cost for every width up to n at least, by width (see _costs): measured (_measured_now), or on
        the line through the measured widths on either side (past either end, through the last two)."""
        costs = self._costs
        if n < len(costs):
            return costs
        if not costs:
            self._measured = sorted(self._measured_now().items())
            if not self._measured:
                raise ValueError("the cost model has no measurement yet; call calibrate() first")
            costs.append(0.0)
        measured, last = self._measured, len(self._measured) - 1
        i = bisect.bisect_left(measured, (len(costs),))  # the first measured width >= the next one to fill
        for width in range(len(costs), n + 1):
            while i <= last and measured[i][0] < width:
                i += 1
            if i <= last and measured[i][0] == width:
                costs.append(measured[i][1])
            elif last == 0:
                costs.append(measured[0][1])
            else:
                j = i if 0 < i <= last else (1 if i == 0 else last)
                (lo, lo_s), (hi, hi_s) = measured[j - 1], measured[j]
                costs.append(max(lo_s + (hi_s - lo_s) / (hi - lo) * (width - lo), 1e-9))
        return costs

    def _measured_now(self) -> dict[int, float]:
        """Every measured width's seconds as the table stands now (_seconds_now)."""
        return {n: self._seconds_now(n, seconds) for n, seconds in self.target_s.items()}

    def tokens_per_s(self, alpha: float | Sequence[float], k: int) -> float:
        """Expected tokens per second of one sequence drafting k tokens a step at this acceptance."""
        return expected_tokens(alpha, k) / (self.target_cost(k + 1) + k * self.draft_s_per_token)

    def speedups(self, alpha: float | Sequence[float], k_max: int) -> list[float]:
        """Predicted speedup over plain decoding of drafting k tokens a step, for k = 0 .. k_max (tokens_per_s
        over tokens_per_s at k = 0), in one pass over the draft positions."""
        rates = self._tokens_per_s_by_k(alpha, k_max)
        return [rate / rates[0] for rate in rates]

    def _tokens_per_s_by_k(self, alpha: float | Sequence[float], k_max: int) -> list[float]:
        """tokens_per_s(alpha, k) for k = 0 .. k_max, in one pass over the draft positions: the controller asks
        at every step, several times, and a helper call per position is a large share of this loop's time."""
        costs = self._costs_up_to(k_max + 1)
        by_position = _by_position(alpha)  # _rate(alpha, k - 1) for k = 1 .. k_max, made once
        if by_position is None:
            by_position = [cast(float, alpha)] * k_max
        elif len(by_position) < k_max:
            by_position = [*by_position, *[by_position[-1]] * (k_max - len(by_position))]
        out, tokens, gain, per_draft = [1.0 / costs[1]], 1.0, 1.0, self.draft_s_per_token
        for k, rate_k, cost in zip(range(1, k_max + 1), by_position, costs[2 : k_max + 2], strict=False):
            gain *= rate_k
            tokens += gain
            out.append(tokens / (cost + k * per_draft))
        return out

    def best_k(self, alpha: float | Sequence[float], k_max: int) -> tuple[int, float]:
        """(k, predicted speedup over plain decoding) maximising expected tokens per second of one
        sequence (tokens_per_s): best_ks with a batch of one. A lone request (AdaptiveK.choose_k)
        passes the rates of the draft class it is about to make, by position, scaled by its own
        evidence."""
        ks, speedup = self.best_ks([(alpha, k_max)])
        return ks[0], speedup

    def best_ks(
        self, outlooks: Sequence[tuple[float | Sequence[float], int] | None], max_slowdown: float = 1.0
    ) -> tuple[list[int], float]:
        """A k for each sequence of one pass, and the pass's predicted speedup over plain decoding.

        outlooks: per sequence, (its expected acceptance: a rate, or rates by draft position; the
        longest draft it may make), or None when it has nothing to draft (k = 0). The pass verifies
        sum_i (k_i + 1) rows and the drafts run one after another:

            rate(k_1 .. k_B) = sum_i E(alpha_i, k_i) / (T_target(sum_i (k_i + 1)) + sum_i k_i T_draft)

        One k for all would make a request whose drafts fail pay for the rows of one whose drafts
        pass, or hold back the one that copies; here each draft is as long as its own expected
        tokens pay for its rows, at what the pass's other rows already cost. Exact: for every total
        D of drafted tokens the split that emits most is built greedily (each sequence's gain per
        extra token never grows), and the D with the best rate wins (ties to the longer drafts).

        max_slowdown: the most the drafts may slow any one sequence of a batch, expected: a split is a choice
        only if every sequence's expected tokens a second, E(alpha_i, k_i) over the pass's seconds, stay at
        least (1 - max_slowdown) of the 1 / T_target(B) a pass drafting nothing gives each (_pace_floor). The
        rows of one that copies lengthen the pass for one that cannot copy, which emits one token however
        long the pass is. 1 (the default): no bound, the most tokens a second over the batch.
        """
        B = len(outlooks)
        if B == 0:
            return [], 1.0
        if B == 1:
            return self._best_k_alone(outlooks[0])
        return self._best_ks_greedy(outlooks, max_slowdown)

    def best_ks_ragged(
        self, outlooks: Sequence[tuple[float | Sequence[float], int] | None], max_slowdown: float = 1.0
    ) -> tuple[list[int], float]:
        """best_ks for a runtime that runs a batched pass as passes taking as many rows of each sequence
        (Capabilities.equal_rows_per_pass: llama.cpp's KV streams in exact mode): every sequence's first row
        goes in one pass of B rows, and a draft's k rows in a pass of their own, T(k) more. Each sequence's best
        draft is the k with the most expected extra tokens per second of its own pass; drafts join best first, and
        the round with the most tokens per second in which every sequence keeps its floor (max_slowdown, as in
        best_ks) wins. Returns the ks and the round's predicted speedup over the B plain rows alone."""
        B = len(outlooks)
        if B == 0:
            return [], 1.0
        seconds = plain = self.target_cost(B)
        floor = _pace_floor(plain, max_slowdown, B)
        tokens = float(B)
        offers = []  # (extra tokens per second, sequence, k, extra tokens, extra seconds): each sequence's best draft
        for i, outlook in enumerate(outlooks):
            if outlook is None or outlook[1] <= 0:
                continue
            alpha, cap = outlook
            costs = [self.target_cost(k) + k * self.draft_s_per_token for k in range(1, cap + 1)]
            gains = [expected_tokens(alpha, k) - 1.0 for k in range(1, cap + 1)]
            best = max(range(cap), key=lambda j: (gains[j] / costs[j], j))  # ties to the longer draft
            offers.append((gains[best] / costs[best], i, best + 1, gains[best], costs[best]))
        # Drafts join best first; of the rounds that makes (no draft, the best one, the best two, ...) the one with
        # the most tokens a second in which every sequence keeps its floor wins (ties to the fewer drafts). Without a
        # floor that is where the rate stops rising: a draft that lowers it has fewer extra tokens a second than the
        # round, the round after it still more than the next draft, so every later one lowers it too. Under a floor
        # a draft joins only beside others: the sequences that do not draft would fall below it.
        ks, best_ks, fastest = [0] * B, [0] * B, tokens / seconds
        each = [1.0] * B  # each sequence's expected tokens this round
        for _, i, k, gain, cost in sorted(offers, reverse=True):
            tokens, seconds, ks[i], each[i] = tokens + gain, seconds + cost, k, 1.0 + gain
            if tokens / seconds > fastest and min(each) >= floor * seconds:
                fastest, best_ks = tokens / seconds, list(ks)
        return best_ks, fastest / (B / plain)

    def _best_ks_greedy(
        self, outlooks: Sequence[tuple[float | Sequence[float], int] | None], max_slowdown: float = 1.0
    ) -> tuple[list[int], float]:
        """best_ks for any batch (see there)."""
        B = len(outlooks)
        # Each sequence's extra expected tokens from its j-th drafted token: the chance every draft token
        # up to it is accepted. They never grow with j, so for any number D of drafted tokens in the pass
        # the best split gives them out one at a time, each to the sequence whose next one adds most.
        heap: list[tuple[float, int, int]] = []  # (-the next token's gain, sequence, tokens it drafts so far)
        for i, o in enumerate(outlooks):
            if o is not None and o[1] > 0:
                heap.append((-_rate(o[0], 0), i, 0))
        heapq.heapify(heap)
        ks, best_ks = [0] * B, [0] * B
        tokens, drafted = float(B), 0
        each = [1.0] * B  # each sequence's expected tokens from the pass, for the floor (max_slowdown)
        plain_s = self.target_cost(B)
        floor = _pace_floor(plain_s, max_slowdown, B)
        plain = best = tokens / plain_s
        while heap:
            minus_gain, i, k = heapq.heappop(heap)
            tokens, drafted, ks[i] = tokens - minus_gain, drafted + 1, k + 1
            each[i] -= minus_gain
            outlook = outlooks[i]
            assert outlook is not None  # only sequences with an outlook entered the heap
            alpha, cap = outlook
            if k + 1 < cap:  # the next token's gain: this one's, times the chance the next is accepted too
                heapq.heappush(heap, (minus_gain * _rate(alpha, k + 1), i, k + 1))
            seconds = self.target_cost(B + drafted) + drafted * self.draft_s_per_token
            rate = tokens / seconds
            if rate >= best and min(each) >= floor * seconds:  # ties to the longer drafts
                best, best_ks = rate, list(ks)
        return best_ks, best / plain

    def _best_k_alone(self, outlook: tuple[float | Sequence[float], int] | None) -> tuple[list[int], float]:
        """best_ks for one sequence: its j-th drafted token is the pass's j-th, so the greedy split is the draft
        itself and the search is one loop over k (the same sums in the same order: the same answer, bit for bit).
        A lone request asks at every step, several times (AdaptiveK), so this path avoids the heap."""
        if outlook is None or outlook[1] <= 0:
            return [0], 1.0
        alpha, cap = outlook
        rates = self._tokens_per_s_by_k(alpha, cap)
        best_k = 0
        for k in range(1, cap + 1):
            if rates[k] >= rates[best_k]:  # ties to the longer drafts
                best_k = k
        return [best_k], rates[best_k] / rates[0]

    def calibrate(
        self,
        target,
        draft=None,
        k_max: int = K_MAX,
        context: int = 64,
        repeats: int = 2,
        max_rows: int = 0,
        every_width_s: float = 1.0,
        interrupted: Callable[[], bool] | None = None,
    ) -> bool:
        """Time target passes of up to k_max + 1 tokens (and one draft token) on a warm cache: every
        width up to DENSE_WIDTHS (where the cost curve bends: memory-bound, then compute-bound), the
        fastest of `repeats`; past it once each, every width if the dense ones say that costs at most
        every_width_s in all, else the widths where grouped-row kernels change slope (calibration_widths).
        target_cost interpolates between them. Each width's time replaces what the table held: this
        is also how a stale table (stale()) is measured again.

        max_rows: a batching server's widest pass (max batch x (k_max + 1)); widths past k_max + 1 are
        then timed at powers of two up to it, once each, for best_ks.
        interrupted: asked before each pass; once it answers True the measurement stops and the table
        is left as it was (a server re-measuring while idle gives way to a request that arrives).
        Returns whether it measured.
        """
        last = k_max + 1
        wide = _batch_widths(last, max_rows)
        prefix = list(range(100, 100 + context))
        seq = target.new_sequence()
        timed: dict[int, float] = {}

        def time_widths(widths: list[int], times: int) -> bool:
            for n in widths:
                block = [(100 + i) % target.vocab_size for i in range(n)]  # any ids: only the time counts
                for _ in range(times):
                    if interrupted is not None and interrupted():
                        return False
                    start = time.perf_counter()
                    seq.forward(block, num_logits=n)
                    seconds = time.perf_counter() - start
                    timed[n] = min(seconds, timed.get(n, seconds))
                    seq.truncate(context)
            return True

        try:
            seq.forward(prefix, num_logits=1)
            if not time_widths([n for n in calibration_widths(k_max) if n <= DENSE_WIDTHS], repeats):
                return False
            rest = range(DENSE_WIDTHS + 1, last + 1)
            dense = CostModel(target_s=dict(timed))
            every = sum(dense.target_cost(n) for n in rest) <= every_width_s
            if not time_widths([n for n in calibration_widths(k_max, every) if n > DENSE_WIDTHS] + wide, 1):
                return False
        finally:
            seq.release()
        if not self.frozen:
            self._adopt(timed)
        if draft is not None:
            self._calibrate_draft(draft, prefix, context, repeats)
        return True

    def _adopt(self, timed: dict[int, float]) -> None:
        """Take a calibration's times: they replace the table's, and become what drift is measured from."""
        self._recalibrations += 1 if self.calibrated else 0
        self.target_s.update(timed)
        self.calibrated = dict(self.target_s)
        self._online.clear()
        self._drift_at.clear()
        self._forget_costs()
        self._calibrated_at = self.steps

    def _calibrate_draft(self, draft, prefix: list[int], context: int, repeats: int) -> None:
        """Time the draft's prefill of `prefix` (per token), then its one-token step, repeats + 1 times."""
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


_TABLES = frozenset({"target_s", "calibrated"})  # CostModel's tables: assigning one forgets the costs derived
_PRIOR_RATES = (PRIOR_ALPHA,) * POSITIONS


def _pace_floor(plain_s: float, max_slowdown: float, sequences: int) -> float:
    """The fewest tokens a second a batch's drafts may leave any one of its sequences (best_ks's max_slowdown):
    (1 - max_slowdown) of one token per plain pass of plain_s seconds; none (0) for a batch of one, whose drafts
    slow nobody else, or with max_slowdown 1 or more."""
    if sequences < 2 or max_slowdown >= 1.0:
        return 0.0
    return (1.0 - max_slowdown) / plain_s


def _batch_widths(last: int, max_rows: int) -> list[int]:
    """The widths past `last` (k_max + 1) that calibrate times for a batching server: powers of two from the
    first past max(16, last), then max_rows itself (none when max_rows <= last)."""
    wide, n = [], 16
    while n <= last:
        n *= 2
    while max_rows > last and n < max_rows:
        wide.append(n)
        n *= 2
    return wide + ([max_rows] if max_rows > last else [])


def calibration_widths(k_max: int, every: bool = False) -> list[int]:
    """The verify-pass widths calibrate times for drafts of up to k_max tokens: every one up to
    DENSE_WIDTHS, then every one (every) or 4j and 4j + 1 (ROW_GROUP), and k_max + 1 itself."""
    last = k_max + 1
    past = range(DENSE_WIDTHS + 1, last)
    grouped = past if every else [n for n in past if n % ROW_GROUP in (0, 1)]
    return sorted({*range(1, min(last, DENSE_WIDTHS) + 1), *grouped, last})
