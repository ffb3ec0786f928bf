"""`spekula audit`: is speculative decoding lossless on these models and prompts?

Two checks, each against plain decoding of the same target:

1. greedy equality: for every prompt and every speculative configuration, the greedy output must
   equal plain decoding's token for token. Where a runtime scores a block with other kernels than one
   token (llama.cpp without --exact; bf16 / fp16), a verify pass and a one-token pass round
   differently, so a near-tie can flip: every difference is reported with the target's top-2 logit
   gap there in both runs and classified as a near-tie or a divergence (spekula.divergence);
2. the sampled distribution: for a few prompts, many seeded speculative samples of the first
   `positions` tokens; at position j, among the samples that share the most common prefix of
   length j, the next token's counts are compared with the target's exact probabilities
   p(. | prompt + prefix) (spekula.sampling.probabilities, the function the engine uses) by
   Pearson's chi-square test. A lossless sampler passes each test with probability 1 - level;
   with Bonferroni's correction over all tests, the whole audit fails falsely with probability at
   most `level` (default 0.01).

A distribution test checks the verifier only through the samples whose token went through a verified
draft (the target accepted a drafted token there, or rejected it and drew the recovered token); a
bonus token or a plain step's token is the target's own sample and shows nothing about verification.
So every test counts them (DistributionTest.drafted), and a configuration whose tests' samples went
through a verified draft less than `min_drafted` of the time (default MIN_DRAFTED, a quarter) fails
as VACUOUS: it passed without testing drafts. A k=auto configuration is sampled at a fixed k
(`dist_k`, default DIST_K): k=auto follows measured timings and may not draft at all.

Against a pair of endpoints only the greedy check runs, on text and without logits (an HTTP API
exposes no exact p), so a difference there is reported but not classified. A request
that fails on either side (an error, or an answer that is not whole: spekula.bench.endpoint) is
listed as an error and its prompt is not compared; the audit then cannot pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from spekula.bench.runner import Contender
from spekula.bench.workloads import WorkItem
from spekula.config import SamplingParams, StopConfig
from spekula.control import FixedK
from spekula.divergence import (
    DIVERGENCE,
    NEAR_TIE,
    NEAR_TIE_GAP,
    Divergence,
    TopLog,
    find_divergence,
    first_difference,
    replay_plain,
)
from spekula.sampling import probabilities
from spekula.stats import chi_square_pvalue
from spekula.trace import StepRecord

# A configuration's distribution test is VACUOUS when less than this share of its tested samples went
# through a verified draft: a verifier's bug then moves its counts too little to be seen (`--min-drafted`).
MIN_DRAFTED = 0.25
DIST_K = 4  # the fixed k a k=auto configuration is sampled at (`--dist-k`)


@dataclass
class GreedyCase:
    config: str
    prompt_id: str
    identical: bool
    tokens: int  # output tokens of plain decoding (characters for endpoints' texts)
    divergence: Divergence | None = None  # where and why the outputs part (None: identical, or both empty)

    @property
    def first_difference(self) -> int | None:
        return self.divergence.position if self.divergence is not None else None

    @property
    def top2_logit_gap(self) -> float | None:
        """The target's top-2 logit gap at the first difference in the plain run (None: not known)."""
        return self.divergence.plain_gap if self.divergence is not None else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["divergence"] = self.divergence.to_dict() if self.divergence is not None else None
        return d


@dataclass
class DistributionTest:
    config: str
    prompt_id: str
    position: int  # output position tested (0 = first generated token)
    prefix: list[int]  # the output tokens conditioned on
    samples: int  # samples that share the prefix
    pvalue: float
    note: str | None = None
    drafted: int = 0  # of `samples`: the token here went through a verified draft (accepted, or rejected + recovered)
    k: int | None = None  # the k it was sampled at (a fixed k for a k=auto configuration: DIST_K)


@dataclass
class AuditReport:
    level: float
    greedy: list[GreedyCase] = field(default_factory=list)
    distribution: list[DistributionTest] = field(default_factory=list)
    endpoint_greedy: list[GreedyCase] = field(default_factory=list)
    endpoint_errors: list[dict[str, Any]] = field(default_factory=list)  # {config, prompt_id, repeat, error}
    min_drafted: float = MIN_DRAFTED  # below this share of samples through a verified draft: vacuous
    default_config: str | None = None  # the configuration a user gets without options (its name), if audited

    @property
    def threshold(self) -> float:
        """Per-test p-value threshold: the level split over every distribution test (Bonferroni)."""
        return self.level / max(1, len(self.distribution))

    @property
    def greedy_passed(self) -> bool:
        return all(c.identical for c in self.greedy + self.endpoint_greedy)

    def drafted_share(self) -> dict[str, float]:
        """Per configuration: the share of its tested samples whose token went through a verified draft."""
        samples: Counter[str] = Counter()
        drafted: Counter[str] = Counter()
        for t in self.distribution:
            samples[t.config] += t.samples
            drafted[t.config] += t.drafted
        return {c: drafted[c] / n if n else 0.0 for c, n in samples.items()}

    @property
    def vacuous(self) -> list[str]:
        """Configurations whose distribution tests passed without testing drafts (see the module's docstring)."""
        return [c for c, share in self.drafted_share().items() if share < self.min_drafted]

    @property
    def distribution_passed(self) -> bool:
        return all(t.pvalue >= self.threshold for t in self.distribution) and not self.vacuous

    @property
    def passed(self) -> bool:
        return self.greedy_passed and self.distribution_passed and not self.endpoint_errors

    def identity(self, config: str) -> tuple[int, int]:
        """(outputs identical to plain decoding, outputs compared) for one configuration's greedy check."""
        cases = [c for c in self.greedy if c.config == config]
        return sum(c.identical for c in cases), len(cases)

    def to_dict(self) -> dict[str, Any]:
        default = self.identity(self.default_config) if self.default_config is not None else None
        return {
            "passed": self.passed,
            "greedy_passed": self.greedy_passed,
            "distribution_passed": self.distribution_passed,
            "level": self.level,
            "threshold": self.threshold,
            "min_pvalue": min((t.pvalue for t in self.distribution), default=None),
            "greedy": [c.to_dict() for c in self.greedy],
            "near_ties": sum(c.divergence is not None and c.divergence.verdict == NEAR_TIE for c in self.greedy),
            "default_config": self.default_config,
            "default_identical": None if not default or not default[1] else {"identical": default[0], "of": default[1]},
            "endpoint_greedy": [c.to_dict() for c in self.endpoint_greedy],
            "endpoint_errors": self.endpoint_errors,
            "distribution": [asdict(t) for t in self.distribution],
            "min_drafted": self.min_drafted,
            "drafted_share": self.drafted_share(),
            "vacuous": self.vacuous,
        }


def audit_greedy(
    contenders: list[Contender],
    items: list[WorkItem],
    prompt_ids: dict[str, list[int]],
    max_tokens: int | None,
    progress=None,
    decode=None,
) -> list[GreedyCase]:
    """Greedy output of every speculative contender against the plain one (contenders[0]); each run
    keeps the target's top-2 per position (TopLog), so a difference is reported with both runs' gaps.
    decode: token ids -> text, to show the tokens where outputs part."""
    plain, spec = contenders[0], contenders[1:]
    greedy = SamplingParams()
    cases = []
    for item in items:
        ids = prompt_ids[item.id]
        stop = StopConfig(max_tokens=item.max_tokens_under(max_tokens))
        plain_log = TopLog()
        reference = plain.engine.generate(ids, greedy, stop, recorder=plain_log).run().token_ids
        for c in spec:
            spec_log = TopLog()
            out = c.engine.generate(ids, greedy, stop, recorder=spec_log).run().token_ids
            cases.append(
                compare_tokens(c.name, item.id, reference, out, plain_log=plain_log, spec_log=spec_log, decode=decode)
            )
            if progress is not None:
                progress()
    return cases


def compare_tokens(
    config: str,
    prompt_id: str,
    reference: list[int],
    output: list[int],
    target=None,
    prompt_ids: list[int] | None = None,
    *,
    plain_log: TopLog | None = None,
    spec_log: TopLog | None = None,
    decode=None,
) -> GreedyCase:
    """reference: plain decoding's tokens, output: the speculative run's. The gaps come from the runs'
    logs; without a plain log but with the target and the prompt, the plain run's row is recomputed
    as plain decoding computes it (replay_plain: one pass per output token, only where outputs part)."""
    if output == reference:
        return GreedyCase(config, prompt_id, True, len(reference))
    plain_row = None
    if plain_log is None and target is not None and prompt_ids is not None:
        plain_row = replay_plain(target, prompt_ids, reference[: first_difference(reference, output)])
    divergence = find_divergence(reference, output, plain_log, spec_log, decode, plain_row=plain_row)
    return GreedyCase(config, prompt_id, False, len(reference), divergence)


def compare_texts(config: str, prompt_id: str, reference: str, output: str) -> GreedyCase:
    """Two endpoints' texts: where they part, without logits (an HTTP API returns none)."""
    if not reference and not output:  # two empty texts show nothing: identity is never claimed on them
        return GreedyCase(config, prompt_id, False, 0)
    if output == reference:
        return GreedyCase(config, prompt_id, True, len(reference))
    i = first_difference(reference, output)
    assert i is not None  # the texts differ
    divergence = Divergence(
        position=i,
        plain_token=None,
        spec_token=None,
        plain_text=reference[i : i + 20] or "<end>",
        spec_text=output[i : i + 20] or "<end>",
        before=reference[max(0, i - 40) : i],
        plain_gap=None,
        spec_gap=None,
        unit="character",
    )
    return GreedyCase(config, prompt_id, False, len(reference), divergence)


class DraftLog:
    """A recorder that keeps, per output position, whether the token there went through a verified draft:
    the step drafted a token at that position, and the target accepted it or rejected it and drew the
    recovered token in its place (a bonus token, or a plain step's, is the target's own draw)."""

    def __init__(self) -> None:
        self.verified: list[bool] = []

    def step(self, record: StepRecord) -> None:
        drafted = len(record.drafted)  # the emitted tokens: accepted ones, then the recovered / bonus one
        self.verified.extend(i < drafted for i in range(len(record.emitted)))

    def request(self, summary: dict[str, Any]) -> None:
        pass


def audit_distribution(
    contenders: list[Contender],
    items: list[WorkItem],
    prompt_ids: dict[str, list[int]],
    sampling: SamplingParams,
    *,
    samples: int,
    positions: int,
    seed: int = 0,
    dist_k: int = DIST_K,
    progress=None,
) -> list[DistributionTest]:
    """Chi-square tests of the speculative sampler against the target's exact p at `positions` positions.
    A k=auto configuration drafts a fixed dist_k (capped at its k_max) here, so that drafts are tested."""
    plain, spec = contenders[0], contenders[1:]
    target = plain.engine.target
    tests = []
    for c in spec:
        engine = c.engine
        k = engine.spec.k if engine.proposer is not None else 0
        if k is None:
            k = min(dist_k, engine.spec.k_max)
        # k tokens past the last tested position: a step drafts no further than max_tokens, so with max_tokens =
        # positions the last tested position would never be drafted. EOS is a token like any other here.
        stop = StopConfig(max_tokens=positions + k, ignore_eos=True)
        for item in items:
            ids = prompt_ids[item.id]
            outs = []
            for s in range(samples):
                log = DraftLog()
                run = engine.generate(ids, replace(sampling, seed=seed + s), stop, recorder=log, controller=FixedK(k))
                outs.append((tuple(run.run().token_ids), log.verified))
                if progress is not None:
                    progress()
            for j in range(positions):
                test = _position_test(target, ids, outs, j, sampling)
                if test is None:
                    break
                tests.append(replace(test, config=c.name, prompt_id=item.id, k=k))
    return tests


def _position_test(
    target, ids: list[int], outs: list[tuple[tuple[int, ...], list[bool]]], j: int, sampling: SamplingParams
) -> DistributionTest | None:
    """The test at output position j over the samples that share its most common prefix (None: no sample
    is that long). outs: each sample's tokens and, per position, whether it went through a verified draft."""
    long_enough = [(o, verified) for o, verified in outs if len(o) > j]
    if not long_enough:
        return None
    prefix = Counter(o[:j] for o, _ in long_enough).most_common(1)[0][0]
    matching = [(o[j], verified[j]) for o, verified in long_enough if o[:j] == prefix]
    seq = target.new_sequence()
    try:
        logits = seq.forward(ids + list(prefix), num_logits=1)[-1]
    finally:
        seq.release()
    p = probabilities(logits, sampling).double().numpy()
    counts = np.bincount(np.asarray([t for t, _ in matching], dtype=np.int64), minlength=p.shape[0])
    note = None
    try:
        pvalue = chi_square_pvalue(counts, p)
    except AssertionError as e:  # a token the target gives probability 0 was emitted
        pvalue, note = 0.0, str(e)
    drafted = sum(v for _, v in matching)
    return DistributionTest("", "", j, [int(t) for t in prefix], len(matching), pvalue, note, drafted)


def format_report(report: AuditReport, sampling: SamplingParams | None = None) -> str:
    lines = []
    if report.greedy:
        lines += _greedy_lines(report)
    if report.endpoint_greedy:
        same = sum(c.identical for c in report.endpoint_greedy)
        lines.append(
            f"greedy equality (endpoints): {same}/{len(report.endpoint_greedy)} outputs identical to the baseline "
            "endpoint -> "
            f"{'PASS' if all(c.identical for c in report.endpoint_greedy) else 'FAIL'}"
        )
        lines += _differences(report.endpoint_greedy)
    if report.endpoint_errors:
        n = len(report.endpoint_errors)
        lines.append(
            f"endpoint requests: {n} failed; their prompts are not compared, so nothing is claimed about them "
            "-> INCOMPLETE"
        )
        lines += [f"  ERROR: {e['config']} on {e['prompt_id']}: {e['error']}" for e in report.endpoint_errors][:20]
    if report.distribution:
        lines += _distribution_lines(report, sampling)
    incomplete = f" ({len(report.endpoint_errors)} endpoint request(s) failed)" if report.endpoint_errors else ""
    lines.append(f"audit: {'PASS' if report.passed else 'FAIL'}{incomplete}{_default_identity(report)}")
    return "\n".join(lines)


def _greedy_lines(report: AuditReport) -> list[str]:
    """The in-process greedy check: identity overall and per configuration, the divergence rate, each difference."""
    cases = report.greedy
    same = sum(c.identical for c in cases)
    rate = f" ({len(cases) - same} differ: {(len(cases) - same) / len(cases):.1%})" if same < len(cases) else ""
    lines = [
        f"greedy equality (in-process): {same}/{len(cases)} outputs identical to plain decoding{rate} -> "
        f"{'PASS' if all(c.identical for c in cases) else 'FAIL'}"
    ]
    configs = list(dict.fromkeys(c.config for c in cases))
    if len(configs) > 1 or report.default_config in configs:
        for config in configs:
            n_same, n = report.identity(config)
            default = " (the default)" if config == report.default_config else ""
            lines.append(f"  {config}{default}: {n_same}/{n} identical")
    return lines + _differences(cases)


def _distribution_lines(report: AuditReport, sampling: SamplingParams | None) -> list[str]:
    t = sampling
    how = f" at temperature {t.temperature}, top-p {t.top_p}, top-k {t.top_k}, min-p {t.min_p}" if t else ""
    worst = min(report.distribution, key=lambda x: x.pvalue)
    lines = [
        f"sampled distribution{how}: {len(report.distribution)} chi-square tests against the target's exact "
        "probabilities, "
        f"smallest p-value {worst.pvalue:.3g} ({worst.config}, {worst.prompt_id}, position {worst.position}, "
        f"{worst.samples} samples); "
        f"threshold {report.threshold:.3g} = level {report.level} / {len(report.distribution)} tests (Bonferroni; "
        f"false-failure rate <= {report.level}) -> "
        f"{'PASS' if all(x.pvalue >= report.threshold for x in report.distribution) else 'FAIL'}"
    ]
    for x in report.distribution:
        flag = "" if x.pvalue >= report.threshold else "   <- FAIL"
        lines.append(
            f"  {x.config:<24} {x.prompt_id:<28} position {x.position}  n={x.samples:<5} "
            f"drafted={x.drafted:<5} p={x.pvalue:.4g}{flag}" + (f"  ({x.note})" if x.note else "")
        )
    lines.append(
        "drafts tested (samples whose token went through a verified draft, accepted or rejected; a test is VACUOUS "
        f"below {report.min_drafted:.0%}, --min-drafted): "
        + ", ".join(
            f"{c} at k={_tested_k(report, c)} {share:.0%}{' VACUOUS' if share < report.min_drafted else ''}"
            for c, share in report.drafted_share().items()
        )
        + f" -> {'FAIL (vacuous: it did not test the verifier)' if report.vacuous else 'PASS'}"
    )
    return lines


def _tested_k(report: AuditReport, config: str) -> str:
    return next((str(t.k) for t in report.distribution if t.config == config and t.k is not None), "?")


def _default_identity(report: AuditReport) -> str:
    """The summary line's claim for the configuration a user gets by default."""
    if report.default_config is None:
        return ""
    same, n = report.identity(report.default_config)
    if not n:
        return ""
    return f"; the default ({report.default_config}): {same}/{n} greedy outputs identical to plain decoding"


def _differences(cases: list[GreedyCase], limit: int = 20) -> list[str]:
    """One line per difference (the first `limit`), then how many were near-ties."""
    different = [c for c in cases if not c.identical]
    lines = [_difference(c) for c in different[:limit]]
    if len(different) > limit:
        lines.append(f"  ... and {len(different) - limit} more (all of them in the JSON results)")
    verdicts = Counter(c.divergence.verdict for c in different if c.divergence is not None)
    if verdicts[NEAR_TIE] or verdicts[DIVERGENCE]:
        lines.append(
            f"  {verdicts[NEAR_TIE]} near-tie(s): the two tokens' logits moved less than {NEAR_TIE_GAP} between the "
            "runs, as a block pass's rounding moves them against a one-token pass (--exact on llama.cpp, --dtype "
            f"float32 elsewhere, makes them agree); {verdicts[DIVERGENCE]} DIVERGENCE(s): not explained by rounding, "
            "a bug?"
        )
    return lines


def _difference(c: GreedyCase) -> str:
    if c.divergence is None:
        return f"  NOTHING TO COMPARE: {c.config} on {c.prompt_id}: both outputs are empty"
    return f"  DIFFERENT: {c.config} on {c.prompt_id}: {c.divergence.describe()}"
