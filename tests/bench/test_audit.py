"""`spekula audit` passes on the real engine and FAILS when a lossy acceptance rule is planted."""

from __future__ import annotations

import pytest
import torch

import spekula.engine
from spekula.bench import commands
from spekula.bench.audit import format_report
from spekula.bench.runner import SpecChoice
from spekula.bench.workloads import load_workload
from spekula.config import SamplingParams
from spekula.sampling import greedy_token, sample
from spekula.verify import Verdict

from benchkit import ByteCodec, contenders_for, table

SAMPLING = SamplingParams(temperature=1.0)


def accept_everything_greedy(draft_tokens, target_logits):
    k = len(draft_tokens)
    return Verdict(k, int(greedy_token(target_logits[k])), k)


def accept_everything_sampled(draft_tokens, draft_probs, target_probs, generator):
    k = draft_tokens.shape[0]
    return Verdict(k, int(sample(target_probs[k], generator)), k)


def run_audit(workload):
    # draft: another table, so q differs from p and a lossy rule shows; n-gram lookup as the second proposer
    contenders = contenders_for(table(0), {"other": table(123)}, [SpecChoice("other", 3), SpecChoice("ngram", 3)])
    return commands.audit(
        contenders,
        ByteCodec(),
        load_workload(workload),
        sampling=SAMPLING,
        max_tokens=16,
        samples=300,
        positions=2,
        dist_prompts=1,
        level=0.01,
        progress=False,
    )


def test_real_engine_passes(unseen_workload):
    report = run_audit(unseen_workload)
    assert report.greedy_passed and len(report.greedy) == 2 * 4
    assert len(report.distribution) == 2 * 1 * 2  # configurations x prompts x positions
    assert all(t.samples > 0 for t in report.distribution)
    assert report.distribution[0].samples == 300  # position 0 uses every sample
    assert report.threshold == pytest.approx(0.01 / 4)
    assert report.distribution_passed and report.passed
    text = format_report(report, SAMPLING)
    assert "audit: PASS" in text and "Bonferroni" in text


def test_planted_greedy_bug_fails(unseen_workload, monkeypatch):
    monkeypatch.setattr(spekula.engine, "verify_greedy", accept_everything_greedy)
    report = run_audit(unseen_workload)
    assert not report.greedy_passed and not report.passed
    bad = [c for c in report.greedy if not c.identical]
    assert bad and all(c.first_difference is not None and c.top2_logit_gap is not None for c in bad)
    assert "DIFFERENT" in format_report(report) and "audit: FAIL" in format_report(report)


def test_planted_sampling_bug_fails(unseen_workload, monkeypatch):
    monkeypatch.setattr(spekula.engine, "verify_sampled", accept_everything_sampled)
    report = run_audit(unseen_workload)
    assert report.greedy_passed  # the greedy rule is intact ...
    assert not report.distribution_passed and not report.passed  # ... the sampled distribution is not
    worst = min(report.distribution, key=lambda t: t.pvalue)
    assert worst.pvalue < 1e-6


def test_distribution_test_needs_sampling(unseen_workload):
    contenders = contenders_for(table(0), {}, [SpecChoice("ngram", 3)])
    with pytest.raises(Exception, match="needs sampling"):
        commands.audit(
            contenders,
            ByteCodec(),
            load_workload(unseen_workload),
            sampling=SamplingParams(),
            max_tokens=8,
            progress=False,
        )
    greedy_only = commands.audit(
        contenders,
        ByteCodec(),
        load_workload(unseen_workload),
        sampling=SamplingParams(),
        max_tokens=8,
        dist_prompts=0,
        progress=False,
    )
    assert greedy_only.passed and not greedy_only.distribution
    assert commands.distribution_sampling(SamplingParams()).temperature == 1.0
    assert torch.get_num_threads() == 1
