"""`spekula audit`: is speculative decoding lossless on these models and prompts?

Two checks, each against plain decoding of the same target:

1. greedy equality: for every prompt and every speculative configuration, the greedy output must
   equal plain decoding's token for token (in float32; in bf16 / fp16 a verify pass over k + 1
   tokens and a one-token pass may round differently, so a near-tie can flip — the report shows
   the target's top-2 logit gap at the first difference to tell the two apart);
2. the sampled distribution: for a few prompts, many seeded speculative samples of the first
   `positions` tokens; at position j, among the samples that share the most common prefix of
   length j, the next token's counts are compared with the target's exact probabilities
   p(. | prompt + prefix) (spekula.sampling.probabilities, the function the engine uses) by
   Pearson's chi-square test. A lossless sampler passes each test with probability 1 - level;
   with Bonferroni's correction over all tests, the whole audit fails falsely with probability at
   most `level` (default 0.01).

Against a pair of endpoints only the greedy check runs (an HTTP API exposes no exact p). A request
that fails on either side (an error, or an answer that is not whole: spekula.bench.endpoint) is
listed as an error and its prompt is not compared; the audit then cannot pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from spekula.bench.runner import Contender
from spekula.bench.workloads import WorkItem
from spekula.config import SamplingParams, StopConfig
from spekula.sampling import probabilities
from spekula.stats import chi_square_pvalue


@dataclass
class GreedyCase:
    config: str
    prompt_id: str
    identical: bool
    tokens: int  # output tokens of plain decoding
    first_difference: int | None = None  # index of the first differing output token
    plain_token: Any = None
    spec_token: Any = None
    top2_logit_gap: float | None = None  # target's logit gap between its two best tokens there (near 0: numerics)


@dataclass
class DistributionTest:
    config: str
    prompt_id: str
    position: int  # output position tested (0 = first generated token)
    prefix: list[int]  # the output tokens conditioned on
    samples: int  # samples that share the prefix
    pvalue: float
    note: str | None = None


@dataclass
class AuditReport:
    level: float
    greedy: list[GreedyCase] = field(default_factory=list)
    distribution: list[DistributionTest] = field(default_factory=list)
    endpoint_greedy: list[GreedyCase] = field(default_factory=list)
    endpoint_errors: list[dict[str, Any]] = field(default_factory=list)  # {config, prompt_id, repeat, error}

    @property
    def threshold(self) -> float:
        """Per-test p-value threshold: the level split over every distribution test (Bonferroni)."""
        return self.level / max(1, len(self.distribution))

    @property
    def greedy_passed(self) -> bool:
        return all(c.identical for c in self.greedy + self.endpoint_greedy)

    @property
    def distribution_passed(self) -> bool:
        return all(t.pvalue >= self.threshold for t in self.distribution)

    @property
    def passed(self) -> bool:
        return self.greedy_passed and self.distribution_passed and not self.endpoint_errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "greedy_passed": self.greedy_passed,
            "distribution_passed": self.distribution_passed,
            "level": self.level,
            "threshold": self.threshold,
            "min_pvalue": min((t.pvalue for t in self.distribution), default=None),
            "greedy": [asdict(c) for c in self.greedy],
            "endpoint_greedy": [asdict(c) for c in self.endpoint_greedy],
            "endpoint_errors": self.endpoint_errors,
            "distribution": [asdict(t) for t in self.distribution],
        }


def audit_greedy(
    contenders: list[Contender],
    items: list[WorkItem],
    prompt_ids: dict[str, list[int]],
    max_tokens: int | None,
    progress=None,
) -> list[GreedyCase]:
    """Greedy output of every speculative contender against the plain one (contenders[0])."""
    plain, spec = contenders[0], contenders[1:]
    greedy = SamplingParams()
    cases = []
    for item in items:
        ids = prompt_ids[item.id]
        stop = StopConfig(max_tokens=item.max_tokens_under(max_tokens))
        reference = plain.engine.generate(ids, greedy, stop).run().token_ids
        for c in spec:
            out = c.engine.generate(ids, greedy, stop).run().token_ids
            cases.append(compare_tokens(c.name, item.id, reference, out, target=plain.engine.target, prompt_ids=ids))
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
) -> GreedyCase:
    if output == reference:
        return GreedyCase(config, prompt_id, True, len(reference))
    i = next((j for j, (a, b) in enumerate(zip(reference, output)) if a != b), min(len(reference), len(output)))
    case = GreedyCase(
        config,
        prompt_id,
        False,
        len(reference),
        i,
        reference[i] if i < len(reference) else "<end>",
        output[i] if i < len(output) else "<end>",
    )
    if target is not None and prompt_ids is not None:
        logits = target.new_sequence().forward(prompt_ids + reference[:i], num_logits=1)[-1]
        top2 = torch.topk(logits.float(), 2).values
        case.top2_logit_gap = float(top2[0] - top2[1])
    return case


def compare_texts(config: str, prompt_id: str, reference: str, output: str) -> GreedyCase:
    if not reference and not output:  # two empty texts show nothing: identity is never claimed on them
        return GreedyCase(config, prompt_id, False, 0, None, "<empty>", "<empty>")
    if output == reference:
        return GreedyCase(config, prompt_id, True, len(reference))
    i = next((j for j, (a, b) in enumerate(zip(reference, output)) if a != b), min(len(reference), len(output)))
    return GreedyCase(config, prompt_id, False, len(reference), i, reference[i : i + 20], output[i : i + 20])


def audit_distribution(
    contenders: list[Contender],
    items: list[WorkItem],
    prompt_ids: dict[str, list[int]],
    sampling: SamplingParams,
    *,
    samples: int,
    positions: int,
    seed: int = 0,
    progress=None,
) -> list[DistributionTest]:
    """Chi-square tests of the speculative sampler against the target's exact p at `positions` positions."""
    plain, spec = contenders[0], contenders[1:]
    target = plain.engine.target
    tests = []
    for c in spec:
        for item in items:
            ids = prompt_ids[item.id]
            stop = StopConfig(max_tokens=positions, ignore_eos=True)  # EOS is a token like any other here
            outs = []
            for s in range(samples):
                outs.append(tuple(c.engine.generate(ids, replace(sampling, seed=seed + s), stop).run().token_ids))
                if progress is not None:
                    progress()
            for j in range(positions):
                long_enough = [o for o in outs if len(o) > j]
                if not long_enough:
                    break
                prefix = Counter(o[:j] for o in long_enough).most_common(1)[0][0]
                matching = [o[j] for o in long_enough if o[:j] == prefix]
                logits = target.new_sequence().forward(ids + list(prefix), num_logits=1)[-1]
                p = probabilities(logits, sampling).double().numpy()
                counts = np.bincount(np.asarray(matching, dtype=np.int64), minlength=p.shape[0])
                note = None
                try:
                    pvalue = chi_square_pvalue(counts, p)
                except AssertionError as e:  # a token the target gives probability 0 was emitted
                    pvalue, note = 0.0, str(e)
                tests.append(
                    DistributionTest(c.name, item.id, j, [int(t) for t in prefix], len(matching), pvalue, note)
                )
    return tests


def format_report(report: AuditReport, sampling: SamplingParams | None = None) -> str:
    lines = []
    if report.greedy:
        same = sum(c.identical for c in report.greedy)
        lines.append(
            f"greedy equality (in-process): {same}/{len(report.greedy)} outputs identical to plain decoding -> "
            f"{'PASS' if all(c.identical for c in report.greedy) else 'FAIL'}"
        )
        lines += [_difference(c) for c in report.greedy if not c.identical][:20]
    if report.endpoint_greedy:
        same = sum(c.identical for c in report.endpoint_greedy)
        lines.append(
            f"greedy equality (endpoints): {same}/{len(report.endpoint_greedy)} outputs identical to the baseline "
            "endpoint -> "
            f"{'PASS' if all(c.identical for c in report.endpoint_greedy) else 'FAIL'}"
        )
        lines += [_difference(c) for c in report.endpoint_greedy if not c.identical][:20]
    if report.endpoint_errors:
        n = len(report.endpoint_errors)
        lines.append(
            f"endpoint requests: {n} failed; their prompts are not compared, so nothing is claimed about them "
            "-> INCOMPLETE"
        )
        lines += [f"  ERROR: {e['config']} on {e['prompt_id']}: {e['error']}" for e in report.endpoint_errors][:20]
    if report.distribution:
        t = sampling
        how = f" at temperature {t.temperature}, top-p {t.top_p}, top-k {t.top_k}, min-p {t.min_p}" if t else ""
        worst = min(report.distribution, key=lambda x: x.pvalue)
        lines.append(
            f"sampled distribution{how}: {len(report.distribution)} chi-square tests against the target's exact "
            "probabilities, "
            f"smallest p-value {worst.pvalue:.3g} ({worst.config}, {worst.prompt_id}, position {worst.position}, "
            f"{worst.samples} samples); "
            f"threshold {report.threshold:.3g} = level {report.level} / {len(report.distribution)} tests (Bonferroni; "
            f"false-failure rate <= {report.level}) -> "
            f"{'PASS' if report.distribution_passed else 'FAIL'}"
        )
        for x in report.distribution:
            flag = "" if x.pvalue >= report.threshold else "   <- FAIL"
            lines.append(
                f"  {x.config:<24} {x.prompt_id:<28} position {x.position}  n={x.samples:<5} p={x.pvalue:.4g}{flag}"
                + (f"  ({x.note})" if x.note else "")
            )
    incomplete = f" ({len(report.endpoint_errors)} endpoint request(s) failed)" if report.endpoint_errors else ""
    lines.append(f"audit: {'PASS' if report.passed else 'FAIL'}{incomplete}")
    return "\n".join(lines)


def _difference(c: GreedyCase) -> str:
    if c.first_difference is None:
        return f"  NOTHING TO COMPARE: {c.config} on {c.prompt_id}: both outputs are empty"
    gap = (
        f"; target's top-2 logit gap there {c.top2_logit_gap:.4g}"
        + (
            " (a near tie: numerics, see --dtype float32)"
            if c.top2_logit_gap is not None and c.top2_logit_gap < 1e-2
            else ""
        )
        if c.top2_logit_gap is not None
        else ""
    )
    return (
        f"  DIFFERENT: {c.config} on {c.prompt_id}: first difference at output position {c.first_difference}: "
        f"plain {c.plain_token!r}, speculative {c.spec_token!r}{gap}"
    )
