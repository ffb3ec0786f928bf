"""How many tokens to draft: one controller per request.

Before each step the controller answers three questions (AdaptiveK.choose_k):

1. how far?      the k the cost model (spekula.cost) predicts is fastest at the acceptance this
                 request's next draft is expected to get, capped while the request is new (slow start)
                 and by the tokens the proposer's draft holds (Proposer.draft_length);
2. speculate?    only if that k is above 0 and the seconds it saves over the rest of the request
                 win back what a cold draft must first spend catching up on the context;
3. probe?        otherwise decode plainly, and every few plain steps draft one token to see whether
                 the text has turned predictable, so a request gets speculation back.

Each answer leaves a short reason (Controller.reason: "speculate: k=7 predicted 1.80x", "plain: best
k=1 predicts 0.97x", "probe: ...", "no draft: no match", "... slow start cap 4") that the step record
and `--trace` carry.

Engine-wide acceptance is a prior, not a verdict. A class never seen starts from what its match length
says (cost.base_acceptance: a long n-gram or suffix match is itself evidence of copying); learnt rates
relax back towards that base (cost.HALF_LIFE) and are learnt per request, not per step (a request's n-th draft
of a class counts 1/n: they are the prior of a request's first drafts, and requests that copy draft at every
step: docs/decisions/0010-rates-per-request.md); and a request's own drafts scale the odds of every
class of their source (DraftClass.source: this request's own text, earlier requests' outputs, the copy
cursor after an edit). Memory of earlier requests earns its drafts per request: whether it holds this
request's text is the request's own business, so a rejected recalled draft all but switches memory off for
the request (AdaptiveK.acceptance), and what the request's own text did lends memory nothing, neither odds
nor a slow-start cap (AdaptiveK.k_cap). A request with no evidence of its own probes at its first draft whose
match length alone would pay, and a probe that is accepted is followed by another at the next such draft,
so a request whose text is being copied gets speculation within a few steps whatever earlier requests
taught; a probe that is rejected makes the next one wait twice as long, so where acceptance is low probes
stay rare.

Acceptance is learnt per *draft class* where the proposer can tell, before drafting, how promising
its next draft is (Proposer.draft_class): n-gram lookup's drafts after a long match are accepted
far more often than after a one-token match (`scripts/experiments/ngram_replay.py --by-class` measures
it), so one alpha for both would bet on the weak matches and hold back on the strong ones. A batching scheduler
chooses every request's k for a round together (CostModel.best_ks), from what each request's controller expects of
its next draft (Controller.outlook): the rows of one pass are shared, so a draft pays only if its expected tokens
pay for its own rows at what the pass's other rows already cost.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from spekula.config import K_MAX
from spekula.cost import POSITIONS, CostModel, base_acceptance
from spekula.draft_class import CONTEXT, NO_DRAFT, RECALLED, SOURCES, DraftClass, draft_source


class Controller(ABC):
    """One per request: chooses k before each step and learns from the outcome."""

    predicted_speedup: float | None = None  # of the last choice, vs plain decoding
    reason: str | None = None  # why the last choice was made, for the step record (e.g. "speculate: k=7 ...")

    @abstractmethod
    def choose_k(
        self,
        remaining: int | None = None,
        catch_up: int = 0,
        draft_class: DraftClass | None = None,
        longest: int | None = None,
        draft_pass_apart: bool = False,
    ) -> int:
        """k for the next step. remaining: tokens the request may still emit (None: unknown);
        catch_up: context tokens the draft must process before its first draft (a cold draft cache);
        draft_class: what the proposer knows of its next draft (Proposer.draft_class; NO_DRAFT: it
        has none to offer, so k = 0); longest: the most tokens that draft can hold (Proposer.draft_length;
        None: as many as asked); draft_pass_apart: this step's draft rows would go in a pass of their own
        (the step that finishes the prompt on a runtime with Capabilities.prompt_pass_apart), so a draft
        of k costs a pass of k rows, not what k rows add to the step's pass."""

    def outlook(
        self, draft_class: DraftClass | None = None, longest: int | None = None
    ) -> tuple[list[float], int] | None:
        """For a batching scheduler choosing this request's k (CostModel.best_ks): the expected
        acceptance of its next draft by position, and the longest draft it may make; None: nothing
        to weigh (no draft to offer, or a controller with a fixed k: the scheduler leaves it be)."""
        return None

    def observe(
        self,
        k: int,
        num_drafted: int,
        num_accepted: int,
        draft_s: float,
        score_s: float | None,
        catch_up: int = 0,
        draft_class: DraftClass | None = None,
    ) -> None:
        """Outcome of one step: what was drafted and accepted, and what the draft and the verify pass
        cost (score_s None: the pass ran inside a batch, so its time is not this request's).
        catch_up: context tokens the draft processed first, inside draft_s (a cold draft's prefill);
        draft_class: the class choose_k was given for this step."""

    @property
    def wants_shadows(self) -> bool:
        """Whether plain steps should keep shadow drafts aside for observe_shadow. Default: no."""
        return False

    def observe_shadow(self, num_drafted: int, num_accepted: int, draft_class: DraftClass | None = None) -> None:
        """A draft made at a plain step and not verified, settled by the tokens emitted since (spekula.shadow):
        how many of its leading tokens would have been accepted. Nothing was run for it. Default: ignored."""


@dataclass
class FixedK(Controller):
    k: int

    def choose_k(
        self,
        remaining: int | None = None,
        catch_up: int = 0,
        draft_class: DraftClass | None = None,
        longest: int | None = None,
        draft_pass_apart: bool = False,
    ) -> int:
        if draft_class == NO_DRAFT:
            self.reason = NO_DRAFT_REASON
            return 0
        self.reason = f"fixed: k={self.k}"
        return self.k


@dataclass
class Evidence:
    """What one request's drafts of one source did against what the engine-wide rates expected of them:
    accepted draft tokens and rejected drafts, and how many of each the rates expected (decayed sums)."""

    accepted: float = 0.0
    rejected: float = 0.0
    expected_accepted: float = 0.0
    expected_rejected: float = 0.0

    def add(
        self, accepted: float, rejected: float, expected_accepted: float, expected_rejected: float, decay: float
    ) -> None:
        """One more settled draft; what came before counts decay times as much."""
        self.accepted = decay * self.accepted + accepted
        self.rejected = decay * self.rejected + rejected
        self.expected_accepted = decay * self.expected_accepted + expected_accepted
        self.expected_rejected = decay * self.expected_rejected + expected_rejected

    def odds(self, weight: float) -> float:
        """How much likelier than the engine-wide rates said these drafts passed, as a factor on the odds:
        accepted tokens over expected, against rejections over expected, each with `weight` pseudo-observations
        of the rates themselves (1.0 before any evidence)."""
        accepted = (self.accepted + weight) / (self.expected_accepted + weight)
        return accepted / ((self.rejected + weight) / (self.expected_rejected + weight))


def _text(draft_class: DraftClass | None) -> str:
    """Whose text a draft of this class copies, which slow start is kept apart by (AdaptiveK.k_cap): earlier
    requests' outputs (RECALLED), or this request's own (CONTEXT: the copy cursor after an edit included)."""
    return RECALLED if draft_source(draft_class) == RECALLED else CONTEXT


NO_DRAFT_REASON = "no draft: no match"
# Slow start: how many plain passes a new request's fully rejected draft may cost it (AdaptiveK.k_cap).
SLOW_START_PASSES = 2


@dataclass
class AdaptiveK(Controller):
    """--k auto: the k the cost model predicts is fastest for this request's expected acceptance."""

    costs: CostModel  # shared by the engine's requests: pass costs and the engine-wide acceptance
    k_max: int = K_MAX
    probe_every: int = 8  # plain steps before the first probe while speculation does not pay (at least)
    probe_budget: float = 0.02  # ... and probes may cost at most this fraction of plain decoding's time
    max_probe_every: int = 128  # ... doubling after every probe that changes nothing
    min_probe_gain: float = 1.2  # probe only where perfect acceptance would beat plain decoding by this much
    prior_weight: float = 2.0  # pseudo-observations of the engine-wide rates, against this request's own
    recall_prior_weight: float = 0.25  # ... for drafts from earlier requests' outputs (see acceptance)
    decay: float = 0.9  # older steps count less: acceptance drifts with the text

    # What this request has learnt (not configuration), per draft source (DraftClass.source): how much
    # likelier than usual its drafts of that source pass.
    _evidence: dict[str, Evidence] = field(
        default_factory=lambda: {source: Evidence() for source in SOURCES}, init=False, repr=False
    )
    # The probe clock: plain steps since the last draft or probe, and how many to wait (0: not set).
    _plain_steps: int = field(default=0, init=False, repr=False)
    _probe_gap: int = field(default=0, init=False, repr=False)
    # Slow start: the longest draft a request may risk while it has no evidence of its own (None: not set yet), and,
    # per text copied (_text) whose fully accepted drafts have doubled it since, the longest it may risk now.
    _first_cap: int | None = field(default=None, init=False, repr=False)
    _caps: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    # Whether the step just chosen is a probe, and whether this request has probed yet.
    _probing: bool = field(default=False, init=False, repr=False)
    _probed: bool = field(default=False, init=False, repr=False)
    # Whether this request has verified a draft yet (shadow drafts teach it, but leave it a new request).
    _verified: bool = field(default=False, init=False, repr=False)
    # Drafts settled so far per class (verified and shadow), which weigh this request's share of the engine-wide rates.
    _class_drafts: dict[DraftClass | None, int] = field(default_factory=dict, init=False, repr=False)

    def choose_k(
        self,
        remaining: int | None = None,
        catch_up: int = 0,
        draft_class: DraftClass | None = None,
        longest: int | None = None,
        draft_pass_apart: bool = False,
    ) -> int:
        self._probing = False
        if draft_class == NO_DRAFT or longest == 0:  # nothing to draft: not a decision, nor a step towards a probe
            self.predicted_speedup = 1.0
            self.reason = NO_DRAFT_REASON
            return 0
        alpha = self.acceptance(draft_class)
        limit = self._limit(draft_class, longest)
        # a draft in a pass of its own (draft_pass_apart) costs T(k), so it is taken only where its expected accepted
        # tokens come faster than plain decoding's (best_ks_ragged with one sequence); no probe there (a whole pass)
        if draft_pass_apart:
            ks, speedup = self.costs.best_ks_ragged([(alpha, limit)])
            k = ks[0]
        else:
            k, speedup = self.costs.best_k(alpha, limit)
        if self._should_speculate(alpha, k, remaining, catch_up):
            self.predicted_speedup = speedup
            self._restart_probe_clock()
            apart = " in a pass of its own" if draft_pass_apart else ""
            self.reason = f"speculate: k={k}{apart} predicted {speedup:.2f}x"
            if k == limit < self.costs.best_k(alpha, self.k_max)[0]:
                self.reason += f", slow start cap {k}" if limit == self.cap(draft_class) else f", a draft of {k}"
            return k
        self.predicted_speedup = 1.0
        if draft_pass_apart:
            self.reason = "plain: a draft here is a pass of its own, dearer than the tokens it is expected to save"
            return 0
        if self._probe_due(remaining, catch_up, draft_class):
            self._probing = self._probed = True
            self.reason = f"probe: k=1, expected acceptance {alpha[0]:.2f}"
            return 1
        self.reason = self._plain_reason(alpha, k, limit)
        return 0

    def _plain_reason(self, alpha: Sequence[float], k: int, cap: int) -> str:
        if k > 0:
            return f"plain: k={k} would not win back a cold draft's catch-up"
        speedups = self.costs.speedups(alpha, cap)
        best, j = max(zip(speedups[1:], range(1, len(speedups)), strict=True))  # ties to the longer draft
        return f"plain: best k={j} predicts {best:.2f}x"

    def _limit(self, draft_class: DraftClass | None, longest: int | None) -> int:
        """The longest draft worth pricing: the class's slow-start cap, and no more tokens than the proposer has.
        A lookup's continuation after a short match holds a token or two, and the pass that verifies it is
        priced at its own width: pricing k tokens it cannot fill (a wider, cheaper-per-row pass) would bet
        on a speedup the step does not get (docs/decisions/0008-price-the-draft-the-proposer-holds.md)."""
        cap = self.cap(draft_class)
        return cap if longest is None else min(cap, longest)

    def _should_speculate(self, alpha: Sequence[float], k: int, remaining: int | None, catch_up: int) -> bool:
        """Draft k tokens only if k is above 0 and what it saves pays back a cold draft's catch-up."""
        return k > 0 and self._pays_back(alpha, k, remaining, catch_up)

    def _restart_probe_clock(self) -> None:
        """Speculation pays again: the next stretch of plain steps waits first_probe_gap before probing."""
        self._plain_steps, self._probe_gap = 0, self.first_probe_gap

    def _probe_due(self, remaining: int | None, catch_up: int, draft_class: DraftClass | None = None) -> bool:
        """Count one more plain step; True when it should be a probe instead: one drafted token that
        tells whether acceptance came back. Each probe costs a wider pass and a draft step, so probes
        that change nothing come ever less often (the gap doubles, up to max_probe_every); one that
        was accepted is followed by another at once (observe). A draft whose match length alone says
        it could not pay is not probed (the clock stays ripe for the next one). A request with no
        evidence of its own probes at its first draft whose match length alone would pay: what other
        requests taught is not a verdict on this one."""
        if self.costs.best_k(1.0, self.k_max)[1] < self.min_probe_gain:
            # Even perfect acceptance would (barely) not pay on this hardware: no probe can change
            # that, and a probe has costs the per-token model leaves out (the draft catching up).
            return False
        self._probe_gap = self._probe_gap or self.first_probe_gap
        self._plain_steps += 1
        base = base_acceptance(draft_class)
        fresh = base is not None and not self._probed and not self._verified
        gap = min(self._probe_gap, self.probe_every) if fresh else self._probe_gap
        if self._plain_steps < (1 if fresh else gap):
            return False
        if remaining is not None and remaining < gap:
            return False  # too few tokens left to win back what a probe costs, even if acceptance came back
        if base is not None and self.costs.best_k(base, self.k_max)[0] == 0:
            return False
        if catch_up and not self._usual_acceptance_pays_back(remaining, catch_up):
            return False
        self._plain_steps = 0
        if not fresh:
            self._probe_gap = min(max(2 * self._probe_gap, self.first_probe_gap), self.max_probe_every)
        return True

    def _usual_acceptance_pays_back(self, remaining: int | None, catch_up: int) -> bool:
        """A probe of a cold draft pays its catch-up first, so it must be won back at the acceptance
        requests here usually get (the engine-wide alpha), not at a perfect one."""
        usual = self.costs.alpha
        k_usual = self.costs.best_k(usual, self.k_max)[0]
        return k_usual > 0 and self._pays_back(usual, k_usual, remaining, catch_up)

    def _pays_back(self, alpha: float | Sequence[float], k: int, remaining: int | None, catch_up: int) -> bool:
        """Would the seconds speculation saves over the remaining tokens (at this alpha and k) cover
        the draft's catch-up prefill first? Only a cold draft has one, and only then is it asked."""
        if not catch_up or remaining is None or k == 0:
            return True
        c = self.costs
        saved_per_token = c.target_cost(1) - 1.0 / c.tokens_per_s(alpha, k)
        return remaining * saved_per_token > catch_up * c.draft_prefill_s_per_token

    def outlook(
        self, draft_class: DraftClass | None = None, longest: int | None = None
    ) -> tuple[list[float], int] | None:
        """Expected acceptance of a draft of this class (acceptance()), up to the slow-start cap and the
        draft's length; None when the proposer has nothing to draft."""
        if draft_class == NO_DRAFT or longest == 0:
            return None
        return self.acceptance(draft_class), self._limit(draft_class, longest)

    @property
    def alpha(self) -> float:
        """This request's running acceptance rate, all draft classes and positions together."""
        prior = self.prior_weight
        accepted = sum(e.accepted for e in self._evidence.values())
        rejected = sum(e.rejected for e in self._evidence.values())
        return (accepted + prior * self.costs.alpha) / (accepted + rejected + prior)

    def acceptance(self, draft_class: DraftClass | None = None) -> list[float]:
        """Expected acceptance of a draft of this class, by position: the engine-wide rates for the
        class, with their odds scaled by this request's own evidence from drafts of the same source
        (DraftClass.source). Requests differ from each other more than a class's rates do (a JSON
        extraction copies its prompt after a 1-token match far more often than a chat reply does), and
        one factor for all of a source's classes learns that from every draft of it the request has
        verified, whichever class they were.

        Sources are kept apart because they fail apart. A draft from the copy cursor after an edit is not
        marked down by the rejections the edits cost the request's other drafts. And the engine-wide rates of
        a draft from earlier requests' outputs (RECALLED) are learnt mostly where memory helps (a template
        whose keys repeat, a second turn), whose requests draft from it at every step; whether memory holds
        this request's text is a property of the request, nearly all or nothing (per request, the first
        token of a recalled draft is accepted from never to most of the time: scripts/experiments/
        warm_replay.py --spread), so its prior weighs little against the request's own record
        (recall_prior_weight): a rejected draft all but switches memory off for the request, a run of accepted
        ones keeps it on through a miss, and a request whose own text copies well does not lend that record to
        memory's drafts."""
        rates = self.costs.prior_acceptance(draft_class)
        odds = self._odds(draft_source(draft_class))
        if odds == 1.0:  # no evidence of this source yet: the engine-wide rates as they are
            return rates
        return [p * odds / (1.0 - p + p * odds) for p in rates]

    def _odds(self, source: str) -> float:
        """The factor this request's own record with a draft source puts on the odds of its drafts."""
        weight = self.recall_prior_weight if source == RECALLED else self.prior_weight
        return self._evidence[source].odds(weight)

    @property
    def first_probe_gap(self) -> int:
        """Plain steps before a probe: probe_every, or more where a probe's wider pass is dear. A
        probe that finds nothing costs T(2) + T_draft - T(1); one every g plain steps costs that
        over g T(1), which probe_budget bounds. Where a 2-token pass costs little more than a plain
        one (oneDNN-packed fp32 weights) that leaves probe_every; where it costs nearly a second pass
        (transformers' fp32, llama.cpp on few cores) probes come far less often (docs/BENCHMARKS.md,
        "Pass costs by width")."""
        c = self.costs
        extra = c.target_cost(2) + c.draft_s_per_token - c.target_cost(1)
        return max(self.probe_every, math.ceil(extra / (self.probe_budget * c.target_cost(1))))

    @property
    def k_cap(self) -> int:
        """Slow start. A new request's alpha is only the engine-wide prior, learnt on other requests,
        and n-gram acceptance in particular differs from prompt to prompt. So until a request has
        evidence of its own, a fully rejected draft may cost it at most SLOW_START_PASSES plain passes
        more than plain decoding: k <= the largest k with T(k + 1) + k T_draft <= (1 + SLOW_START_PASSES)
        T(1). Each fully accepted draft doubles the rows a draft may cost (k + 1 -> 2 (k + 1)), up to
        k_max. Where verification and drafts are cheap (packed fp32 weights, n-gram lookup) the cap
        starts at or near k_max and changes little; a draft model's own steps count against it, so its
        cap starts lower; where a wide pass is dear (transformers' fp32, llama.cpp on few cores) a wrong
        prior costs a short draft instead of a long one.

        Why two passes, and rows: with one pass (k <= 1 on llama.cpp, whose 2-row pass costs most of a
        second plain one: docs/BENCHMARKS.md, "Pass costs by width") a request's first drafts were the
        widths that lose most per row, and short outputs (JSON) never got past them; doubling k from 3
        landed on 7 and 13 rows, between llama.cpp's 4-row groups, where doubling rows lands on 8 and 16. The
        price: a wrong prior costs a 4-row pass instead of a 2-row one, so prose that drafts little loses a
        little. The replays that decided it (scripts/experiments/ngram_replay.py, two machines' pass costs,
        prompts it was and was not chosen on) are docs/decisions/0003-slow-start.md.

        Evidence of its own is kept per text copied (cap): drafts of this request's own text that passed say
        nothing of what earlier requests' outputs will do here, so memory's drafts start at the first cap
        however far the request's own text has doubled its own, and double it with their own. This property:
        the cap of drafts from the request's own text (the copy cursor's included)."""
        return self.cap(None)

    def cap(self, draft_class: DraftClass | None = None) -> int:
        """The slow-start cap (k_cap) for a draft of this class: that of the text it copies (_text)."""
        cap = self._caps.get(_text(draft_class))
        if cap is not None:
            return cap
        if self._first_cap is None:
            c = self.costs
            plain = c.target_cost(1)
            budget = (1 + SLOW_START_PASSES) * plain
            fits = [k for k in range(1, self.k_max + 1) if c.target_cost(k + 1) + k * c.draft_s_per_token <= budget]
            self._first_cap = max(fits, default=1)
        return self._first_cap

    def observe(
        self,
        k: int,
        num_drafted: int,
        num_accepted: int,
        draft_s: float,
        score_s: float | None,
        catch_up: int = 0,
        draft_class: DraftClass | None = None,
    ) -> None:
        self.costs.tick()
        if score_s is not None:
            self.costs.observe_target(num_drafted + 1, score_s)
        if self._probing and num_drafted and num_accepted == num_drafted:
            self._probe_gap = 1  # the probe passed: probe again at the next draft that might pay
        if num_drafted:
            if catch_up <= 1:  # else draft_s is mostly the draft's prefill: not a price per drafted token
                self.costs.observe_draft(num_drafted, draft_s)
            self._verified = True
            self._learn(num_drafted, num_accepted, draft_class)

    @property
    def wants_shadows(self) -> bool:
        """Until this request has verified a draft of its own: shadows are for the cold start, when a request
        has no evidence but its match lengths and other requests' rates. Once it verifies drafts, those
        teach it (in the bench, shadows all along made JSON and prose requests draft where they lost)."""
        return not self._verified

    def observe_shadow(self, num_drafted: int, num_accepted: int, draft_class: DraftClass | None = None) -> None:
        """Learnt as a verified draft is (this request's odds, the engine-wide rates of its class): a shadow is
        the same draft at the same point, only nobody paid for its rows. The slow-start cap doubles only for
        a shadow at least as long as the cap: a few matching tokens do not prove that a long draft would
        pass. And the request stays new (its first probe comes as a new request's does, _probe_due): what
        it has verified, not what it has watched, makes it a request with evidence of its own."""
        if num_drafted:
            self._learn(num_drafted, num_accepted, draft_class, proves_cap=num_drafted >= self.cap(draft_class))

    def _learn(
        self, num_drafted: int, num_accepted: int, draft_class: DraftClass | None, proves_cap: bool = True
    ) -> None:
        """What a settled draft of num_drafted tokens, num_accepted of them accepted, says of acceptance."""
        rejected = 1.0 if num_accepted < num_drafted else 0.0
        source = draft_source(draft_class)
        if not rejected and proves_cap:
            self._caps[_text(draft_class)] = min(2 * (self.cap(draft_class) + 1) - 1, self.k_max)  # twice the rows
        prior = self.costs.prior_acceptance(draft_class)
        tried = [prior[min(i, POSITIONS - 1)] for i in range(int(num_accepted + rejected))]
        evidence = self._evidence[source]
        evidence.add(num_accepted, rejected, sum(tried), sum(1.0 - p for p in tried), self.decay)
        # The engine-wide rates are the prior of a request's first drafts of a class, so they are learnt per request:
        # its n-th draft of the class counts 1/n. Counted per step, requests that copy (drafting at every step)
        # would make them theirs, and a request that does not copy would start from rates it never gets.
        drafts = self._class_drafts[draft_class] = self._class_drafts.get(draft_class, 0) + 1
        self.costs.observe_acceptance(num_drafted, num_accepted, draft_class, weight=1.0 / drafts)
