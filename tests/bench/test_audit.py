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
from spekula.noise import draw
from spekula.sampling import greedy_token
from spekula.verify import Verdict

from benchkit import ByteCodec, contenders_for, table

SAMPLING = SamplingParams(temperature=1.0)


def accept_everything_greedy(draft_tokens, target_logits):
    k = len(draft_tokens)
    return Verdict(k, int(greedy_token(target_logits[k])), k)


def accept_everything_sampled(draft_tokens, target_probs, noise):
    k = len(draft_tokens)
    return Verdict(k, draw(target_probs[k], noise.uniform(k)), k)


def run_audit(workload, choices=(SpecChoice("other", 3), SpecChoice("ngram", 3)), **options):
    # draft: another table, so q differs from p and a lossy rule shows; n-gram lookup as the second proposer
    contenders = contenders_for(table(0), {"other": table(123)}, list(choices))
    return commands.audit(
        contenders,
        ByteCodec(),
        load_workload(workload),
        sampling=SAMPLING,
        max_tokens=16,
        samples=options.pop("samples", 300),
        positions=2,
        dist_prompts=1,
        level=0.01,
        progress=False,
        **options,
    )


def test_real_engine_passes(unseen_workload):
    report = run_audit(unseen_workload)
    assert report.greedy_passed and len(report.greedy) == 2 * 4
    assert len(report.distribution) == 2 * 1 * 2  # configurations x prompts x positions
    assert all(t.samples > 0 for t in report.distribution)
    assert report.distribution[0].samples == 300  # position 0 uses every sample
    assert report.threshold == pytest.approx(0.01 / 4)
    assert report.distribution_passed and report.passed
    # a draft model drafts at every step: every tested token went through a verified draft, the last position too
    assert [t.drafted for t in report.distribution if t.config == "other k=3"] == [
        t.samples for t in report.distribution if t.config == "other k=3"
    ]
    assert report.drafted_share()["other k=3"] == 1.0 and not report.vacuous
    text = format_report(report, SAMPLING)
    assert "audit: PASS" in text and "Bonferroni" in text
    assert "drafted=300" in text and "other k=3 at k=3 100%" in text


def test_planted_greedy_bug_fails(unseen_workload, monkeypatch):
    monkeypatch.setattr(spekula.engine, "verify_greedy", accept_everything_greedy)
    report = run_audit(unseen_workload)
    assert not report.greedy_passed and not report.passed
    bad = [c for c in report.greedy if not c.identical]
    assert bad and all(c.first_difference is not None and c.top2_logit_gap is not None for c in bad)
    assert "DIFFERENT" in format_report(report) and "audit: FAIL" in format_report(report)


def test_planted_sampling_bug_fails(unseen_workload, monkeypatch):
    monkeypatch.setattr(spekula.engine, "verify_positional", accept_everything_sampled)
    report = run_audit(unseen_workload)
    assert report.greedy_passed  # the greedy rule is intact ...
    assert not report.distribution_passed and not report.passed  # ... the sampled distribution is not
    worst = min(report.distribution, key=lambda t: t.pvalue)
    assert worst.pvalue < 1e-6
    assert not report.vacuous  # it failed on the counts of tested drafts, not for want of drafts


def test_no_drafts_is_vacuous_not_a_pass(unseen_workload):
    # a configuration that never drafts: its samples are plain decoding's, so its tests pass and prove nothing
    report = run_audit(unseen_workload, [SpecChoice("other", 0, label="drafting off")], samples=100)
    assert report.distribution and all(t.pvalue >= report.threshold for t in report.distribution)
    assert all(t.drafted == 0 for t in report.distribution)
    assert report.vacuous == ["drafting off"]
    assert not report.distribution_passed and not report.passed
    text = format_report(report, SAMPLING)
    assert "drafting off at k=0 0% VACUOUS" in text and "did not test the verifier" in text
    assert text.endswith("audit: FAIL") and report.to_dict()["vacuous"] == ["drafting off"]


def test_a_share_below_the_threshold_is_vacuous(unseen_workload):
    report = run_audit(unseen_workload, [SpecChoice("other", 3)], samples=100, min_drafted=1.0)
    assert report.drafted_share() == {"other k=3": 1.0} and report.passed  # every sample drafted: 1.0 is enough
    report.distribution[0].drafted -= 1
    assert report.vacuous == ["other k=3"] and not report.passed


def test_k_auto_is_sampled_at_a_fixed_k(unseen_workload):
    report = run_audit(unseen_workload, [SpecChoice("other", None)], samples=100, dist_k=2)
    assert {t.k for t in report.distribution} == {2}
    assert report.drafted_share() == {"other k=auto": 1.0} and report.passed
    assert "other k=auto at k=2 100%" in format_report(report, SAMPLING)


def test_the_summary_line_gives_the_defaults_identity(unseen_workload):
    report = run_audit(unseen_workload, samples=50, default_config="ngram k=3")
    assert report.identity("ngram k=3") == (4, 4)
    text = format_report(report, SAMPLING)
    assert "  ngram k=3 (the default): 4/4 identical" in text
    assert (
        text.splitlines()[-1] == "audit: PASS; the default (ngram k=3): 4/4 greedy outputs identical to plain decoding"
    )
    assert report.to_dict()["default_identical"] == {"identical": 4, "of": 4}


def test_the_default_configuration_is_found_by_its_options():
    from spekula.bench.cli import choices_from_args, default_config_name
    from spekula.cli import build_parser
    from spekula.options import backend_from_args
    from spekula.pipeline import default_draft

    def args_of(*argv):
        return build_parser().parse_args(["audit", *argv])

    args = args_of("--spec", "draft=ngram,k=3", "--spec", "k=auto")
    default = default_draft(backend_from_args(args).runtime)
    args = args_of("--spec", "draft=ngram,k=3", "--spec", f"draft={default},k=auto")
    assert default_config_name(args, choices_from_args(args)) == f"{default} k=auto"
    args = args_of("--spec", f"draft={default},k=auto,exact=off", "--spec", f"draft={default},k=4")
    assert default_config_name(args, choices_from_args(args)) is None  # exact=off and k=4 are not what users get
    args = args_of("--spec", f"draft={default},k=auto,exact=on")
    assert default_config_name(args, choices_from_args(args)) == f"{default} k=auto exact=on"  # on is the default
    args = args_of("--no-exact", "--spec", f"draft={default},k=auto")
    assert default_config_name(args, choices_from_args(args)) is None


def test_audit_help_states_the_vacuity_threshold_and_the_fixed_k():
    from spekula.bench.audit import DIST_K, MIN_DRAFTED
    from spekula.cli import parser_and_commands

    text = " ".join(parser_and_commands()[1]["audit"].format_help().split())
    assert f"default {MIN_DRAFTED}: spekula.bench.audit.MIN_DRAFTED" in text and "VACUOUS" in text
    assert f"default {DIST_K}: spekula.bench.audit.DIST_K" in text


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
