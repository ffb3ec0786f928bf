"""Where a speculative output departs from plain decoding: position, tokens, both runs' top-2 logit gaps,
and the verdict (near-tie flipped by a block pass's rounding, or a divergence that rounding cannot explain).

The target is a tiny in-memory model that spells the alphabet ('c' -> 'd' -> 'e' ...) with a clear margin,
except after 'e', where 'f' leads a rival token by `tie_gap` only. Its block passes (more than one token in a
pass, as a verify pass is) add `block_shift` to the rival's logit: the runtime is not block-invariant, like
llama.cpp without --exact. The draft is the same model run one token at a time, so it proposes 'f'.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import spekula.engine
from spekula.backends.base import Capabilities
from spekula.bench import commands
from spekula.bench.audit import GreedyCase, compare_texts, compare_tokens, format_report
from spekula.bench.runner import SpecChoice, build_contenders
from spekula.bench.workloads import WorkItem
from spekula.cli import main
from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.divergence import (
    BIT_IDENTICAL,
    DIVERGENCE,
    NEAR_TIE,
    NEAR_TIE_GAP,
    NEAR_TIES,
    UNKNOWN,
    TopLog,
    classify,
    find_divergence,
    first_difference,
    guarantee,
    near_ties,
    ranked,
    replay_plain,
    top2_gap,
    trail,
)
from spekula.engine import Engine
from spekula.pipeline import Pipeline
from spekula.proposers import DraftModelFactory
from spekula.testing import FunctionBackend, FunctionSequence
from spekula.text import TextCodec
from spekula.verify import Verdict

from pipelinekit import EOS, VOCAB, ByteTokenizer

RIVAL = ord("X")
MARGIN = 5.0  # the best token's lead everywhere but after 'e'


def alphabet(tie_gap: float, rival: int = RIVAL):
    def logits_fn(prefix: list[int]) -> torch.Tensor:
        last = prefix[-1]
        nxt = last + 1 if ord("a") <= last < ord("z") else ord("a")
        logits = torch.zeros(VOCAB)
        logits[nxt] = MARGIN
        if last == ord("e"):
            logits[rival] = MARGIN - tie_gap
        return logits

    return logits_fn


class BlockSequence(FunctionSequence):
    def _forward(self, token_ids, num_logits):
        logits = super()._forward(token_ids, num_logits)
        if len(token_ids) > 1:  # a block pass: other "kernels", other rounding
            logits[:, self.backend.rival] += self.backend.block_shift
        return logits


class BlockBackend(FunctionBackend):
    capabilities = Capabilities(block_invariant=False)

    def __init__(self, tie_gap: float, block_shift: float, rival: int = RIVAL) -> None:
        super().__init__(alphabet(tie_gap, rival), VOCAB, eos=EOS, name="block-rounding")
        self.rival, self.block_shift = rival, block_shift

    def new_sequence(self):
        return BlockSequence(self)


def runs(target, tie_gap: float, rival: int = RIVAL, prompt: str = "abc", n: int = 10):
    """Plain and speculative (k = 4) greedy runs of `target`, each with its TopLog."""
    draft = FunctionBackend(alphabet(tie_gap, rival), VOCAB, eos=EOS)  # block-invariant: drafts 'f' after 'e'
    ids = list(prompt.encode())
    stop = StopConfig(max_tokens=n)
    plain_log, spec_log = TopLog(), TopLog()
    plain = Engine(target).generate(ids, SamplingParams(), stop, recorder=plain_log).run().token_ids
    spec_engine = Engine(target, DraftModelFactory(draft), SpecConfig(k=4))
    spec = spec_engine.generate(ids, SamplingParams(), stop, recorder=spec_log).run().token_ids
    return ids, plain, spec, plain_log, spec_log


def decode(ids):
    return ByteTokenizer().decode(ids)


def test_ranked_rows_and_first_difference():
    rows = ranked(torch.tensor([[0.0, 3.0, 2.5], [1.0, -1.0, 0.0]]), k=2)
    assert rows == [[(1, 0.0), (2, 0.5)], [(0, 0.0), (2, 1.0)]]
    assert top2_gap(rows[0]) == 0.5 and trail(rows[1], 2) == 1.0 and trail(rows[1], 1) is None
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one output ended


def test_a_flipped_near_tie_is_reported_with_both_gaps():
    target = BlockBackend(tie_gap=0.01, block_shift=0.02)
    _, plain, spec, plain_log, spec_log = runs(target, 0.01)
    assert decode(plain).startswith("def") and decode(spec).startswith("deX")
    d = find_divergence(plain, spec, plain_log, spec_log, decode)
    assert (d.position, d.plain_token, d.spec_token) == (2, ord("f"), RIVAL)
    assert (d.plain_text, d.spec_text, d.before) == ("f", "X", "de")
    assert d.plain_gap == pytest.approx(0.01, abs=1e-5)  # the one-token pass: 'f' ahead of 'X'
    assert d.spec_gap == pytest.approx(0.01, abs=1e-5)  # the verify pass's row: 'X' ahead of 'f'
    assert d.plain_trail == pytest.approx(0.01, abs=1e-5) and d.moved == pytest.approx(0.02, abs=1e-5)
    assert d.verdict == NEAR_TIE
    line = d.describe()
    assert "output token 2" in line and "'f'" in line and "'X'" in line and "near-tie (kernel rounding)" in line
    assert "top-2 logit gap: plain 0.01, speculative 0.01" in line
    assert json.loads(json.dumps(d.to_dict()))["label"] == "near-tie (kernel rounding)"


def test_a_flip_that_rounding_cannot_explain_is_a_divergence():
    gap = NEAR_TIE_GAP + 2.0
    target = BlockBackend(tie_gap=gap, block_shift=gap + 1.0)
    _, plain, spec, plain_log, spec_log = runs(target, gap)
    d = find_divergence(plain, spec, plain_log, spec_log, decode)
    assert d.position == 2 and d.plain_gap == pytest.approx(gap, abs=1e-5) and d.spec_gap == pytest.approx(1.0)
    assert d.verdict == DIVERGENCE and "DIVERGENCE (bug?)" in d.describe()


def test_a_planted_verifier_bug_is_a_divergence(monkeypatch):
    def accept_everything(draft_tokens, target_logits):
        k = len(draft_tokens)
        return Verdict(k, int(torch.argmax(target_logits[k])), k)

    monkeypatch.setattr(spekula.engine, "verify_greedy", accept_everything)
    target = BlockBackend(tie_gap=MARGIN, block_shift=0.0)  # block-invariant; 'X' never near 'f'
    draft_says = alphabet(0.0, RIVAL)  # a draft with another opinion after 'e' ('X' first: argmax takes the first max)

    def stubborn(prefix):
        logits = draft_says(prefix)
        if prefix[-1] == ord("e"):
            logits[RIVAL] += 1.0
        return logits

    ids, stop = list(b"abc"), StopConfig(max_tokens=10)
    plain_log, spec_log = TopLog(), TopLog()
    plain = Engine(target).generate(ids, SamplingParams(), stop, recorder=plain_log).run().token_ids
    bad = Engine(target, DraftModelFactory(FunctionBackend(stubborn, VOCAB)), SpecConfig(k=4))
    spec = bad.generate(ids, SamplingParams(), stop, recorder=spec_log).run().token_ids
    d = find_divergence(plain, spec, plain_log, spec_log, decode)
    assert d.position == 2 and d.spec_token == RIVAL
    assert spec_log.at(2)[0][0] == ord("f")  # the verify row wanted 'f': the emitted 'X' is not even its best
    assert d.verdict == DIVERGENCE


def test_a_run_that_ends_at_the_flip_names_its_stop_token():
    target = BlockBackend(tie_gap=0.01, block_shift=0.02, rival=EOS)
    _, plain, spec, plain_log, spec_log = runs(target, 0.01, rival=EOS)
    assert len(spec) == 2  # 'd', 'e', then EOS won the verify row
    d = find_divergence(plain, spec, plain_log, spec_log, decode)
    assert (d.position, d.spec_text, d.spec_token, d.plain_text) == (2, "<end>", EOS, "f")
    assert d.verdict == NEAR_TIE


def test_identical_runs_have_no_divergence_and_the_trace_keeps_the_gaps():
    target = BlockBackend(tie_gap=0.01, block_shift=0.0)  # no rounding difference: nothing flips
    _, plain, spec, plain_log, spec_log = runs(target, 0.01)
    assert plain == spec and find_divergence(plain, spec, plain_log, spec_log) is None
    assert [row[0][0] for row in spec_log.rows] == spec == [row[0][0] for row in plain_log.rows]
    assert [top2_gap(row) for row in plain_log.rows] == pytest.approx([MARGIN, MARGIN, 0.01] + [MARGIN] * 7, abs=1e-5)


def test_replay_plain_recomputes_the_plain_runs_row_not_a_block_prefills():
    target = BlockBackend(tie_gap=0.01, block_shift=0.02)
    ids, plain, spec, plain_log, _ = runs(target, 0.01)
    assert replay_plain(target, ids, plain[:2]) == plain_log.at(2)
    block = ranked(target.new_sequence().forward(ids + plain[:2], num_logits=1))[-1]
    assert block[0][0] == RIVAL  # a prefill over the prefix is a block pass: it would have told another story
    case = compare_tokens("spec", "p", plain, spec, target, ids, decode=decode)  # no logs: replayed, plain side only
    assert case.top2_logit_gap == pytest.approx(0.01, abs=1e-5) and case.divergence.spec_gap is None
    assert case.divergence.verdict == NEAR_TIE


def test_classify_adds_up_how_far_the_two_tokens_moved():
    f, x, q = ord("f"), RIVAL, ord("q")
    assert classify(f, x, [(f, 0.0), (x, 0.1)], [(x, 0.0), (f, 0.1)]) == NEAR_TIE
    assert classify(f, x, [(f, 0.0), (x, 0.1)], None) == NEAR_TIE  # one side known
    # a three-way near-tie: 'X' was not plain's runner-up, but close
    assert classify(f, x, [(f, 0.0), (q, 0.05), (x, 0.1)], [(x, 0.0), (f, 0.1)]) == NEAR_TIE
    assert classify(f, x, [(f, 0.0), (x, 0.6)], [(x, 0.0), (f, NEAR_TIE_GAP - 0.6)]) == DIVERGENCE  # moved too far
    assert classify(f, x, [(f, 0.0), (q, 0.1)], [(x, 0.0), (f, 0.1)]) == DIVERGENCE  # 'X' not in plain's top
    assert classify(f, x, [(f, 0.0), (x, 0.1)], [(f, 0.0), (x, 0.1)]) == DIVERGENCE  # took a token not its best
    assert classify(f, x, None, None) == UNKNOWN


def test_endpoint_texts_are_compared_without_logits():
    case = compare_texts("spec", "p", "hello world", "hello there")
    assert case.first_difference == 6 and case.divergence.verdict == UNKNOWN
    assert "output character 6" in case.divergence.describe() and "no logits" in case.divergence.describe()


def test_audit_reports_every_difference_with_its_verdict():
    target = BlockBackend(tie_gap=0.01, block_shift=0.02)
    draft = FunctionBackend(alphabet(0.01), VOCAB, eos=EOS)
    codec = TextCodec(ByteTokenizer())
    contenders = build_contenders(target, codec, [SpecChoice("same", 4)], load_draft=lambda name: draft)
    items = [WorkItem("flips", "test", prompt="abc"), WorkItem("no-e", "test", prompt="mno")]
    report = commands.audit(
        contenders, codec, items, sampling=SamplingParams(), max_tokens=8, dist_prompts=0, progress=False
    )
    flips, clean = report.greedy
    assert clean.identical and clean.divergence is None
    assert not flips.identical and flips.divergence.verdict == NEAR_TIE
    assert flips.divergence.plain_gap == pytest.approx(0.01, abs=1e-5)
    assert flips.divergence.spec_gap == pytest.approx(0.01, abs=1e-5)
    text = format_report(report)
    assert "first difference at output token 2 (after 'de'): plain 'f' (id 102), speculative 'X' (id 88)" in text
    assert "1 near-tie(s)" in text and "audit: FAIL" in text
    saved = report.to_dict()
    assert saved["near_ties"] == 1 and saved["greedy"][0]["divergence"]["verdict"] == NEAR_TIE
    assert isinstance(flips, GreedyCase) and json.dumps(saved)


def test_generate_compare_reports_the_divergence(monkeypatch, capsys):
    def load(*args, **kwargs):
        target = BlockBackend(tie_gap=0.01, block_shift=0.02)
        draft = DraftModelFactory(FunctionBackend(alphabet(0.01), VOCAB, eos=EOS))
        return Pipeline(target, TextCodec(ByteTokenizer()), draft, SpecConfig(k=4), draft_name="same")

    monkeypatch.setattr(Pipeline, "load", staticmethod(load))
    argv = ["generate", "abc", "--draft", "ngram", "--k", "4", "--max-tokens", "8", "--compare"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["identical"] is False
    d = out["divergence"]
    assert (d["position"], d["plain_text"], d["spec_text"], d["verdict"]) == (2, "f", "X", NEAR_TIE)
    assert d["plain_gap"] == pytest.approx(0.01, abs=1e-5) and d["spec_gap"] == pytest.approx(0.01, abs=1e-5)
    # the run says which promise it had (the runtime is not block-invariant) and lists where it could part
    assert out["guarantee"]["kind"] == NEAR_TIES and "--exact" in out["guarantee"]["text"]
    ties = out["near_ties"]
    assert ties["gap"] == NEAR_TIE_GAP and [t["position"] for t in ties["positions"]] == [2]
    assert ties["positions"][0]["top2_gap"] == pytest.approx(d["spec_gap"])
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "outputs DIFFERENT" in captured.out and "near-tie (kernel rounding)" in captured.out
    assert "guarantee: greedy output is identical to plain decoding except where" in captured.out
    assert "near-ties in this run (top-2 logit gap < 1.0): 2 (gap 0.01)" in captured.out


class ExactBackend(FunctionBackend):
    """A runtime in exact mode: blocks of at most 3 tokens per pass, bit-identical to one-token passes."""

    def single_pass_width(self):
        return 3


@pytest.mark.parametrize(
    "target, shared, kind, words",
    [
        (ExactBackend(alphabet(1.0), VOCAB, eos=EOS), False, BIT_IDENTICAL, "at most 3 tokens"),
        (BlockBackend(0.01, 0.02), False, NEAR_TIES, "(--exact, llama.cpp's default) makes them bit-identical"),
        (BlockBackend(0.01, 0.02), True, NEAR_TIES, "a batch of requests or a kept prompt's cache"),
        (FunctionBackend(alphabet(1.0), VOCAB, eos=EOS), False, NEAR_TIES, "in another order"),
    ],
)
def test_the_guarantee_follows_the_runtime(target, shared, kind, words):
    promise = guarantee(target, shared=shared)
    assert promise.kind == kind and words in promise.text
    assert promise.width == (3 if kind == BIT_IDENTICAL else None)
    assert json.dumps(promise.to_dict())


def test_the_exact_guarantee_says_what_the_prompt_cache_keeps():
    """Where rows hold other bits by the kind of pass (Capabilities.pass_kind_widths), a server's promise says whether
    an answer can depend on the requests before it (--prompt-cache-any-rows)."""
    target = ExactBackend(alphabet(1.0), VOCAB, eos=EOS)
    target.capabilities = replace(target.capabilities, pass_kind_widths=(4, 32, 64))
    assert "does not depend on the requests served before it" in guarantee(target, shared=True).text
    assert "can depend on the requests served before it" in guarantee(target, shared=True, any_rows=True).text
    assert "requests served before" not in guarantee(target).text  # one request: nothing before it
    assert "requests served before" not in guarantee(ExactBackend(alphabet(1.0), VOCAB, eos=EOS), shared=True).text


def test_near_ties_lists_positions_below_the_gap():
    _, _, _, _, spec_log = runs(BlockBackend(tie_gap=0.01, block_shift=0.02), tie_gap=0.01)
    assert [p for p, _ in near_ties(spec_log, end=8)] == [2]
    assert near_ties(spec_log, end=2) == [] and near_ties(spec_log, gap=0.001) == []
    assert all(g < NEAR_TIE_GAP for _, g in near_ties(spec_log)) and len(near_ties(spec_log)) < len(spec_log.rows)
