"""`spekula bench --repeats` with the suffix proposer, whose memory of earlier requests lives as long as a
configuration: within one repeat later prompts draft from earlier prompts' outputs (as on a server), but no
request ever drafts its own prompt's output from an earlier repeat or from the warm-up."""

from __future__ import annotations

from spekula.bench.runner import SpecChoice, run_inprocess
from spekula.bench.workloads import load_workload
from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.proposers import SuffixFactory

from benchkit import VOCAB, ByteCodec, contenders_for, table, write_jsonl

K = 8
PROMPTS = [
    {"id": "tale", "prompt": "Once upon a time there was"},
    {"id": "tale-again", "prompt": "Once upon a time there was"},  # a second request for the same text
    {"id": "code", "prompt": "def add(a, b):"},
]


def test_repeats_never_draft_their_own_earlier_output(tmp_path):
    target = table(0)  # a random table: an output rarely repeats itself, so drafts come from the memory
    items = load_workload(write_jsonl(tmp_path / "w.jsonl", PROMPTS))
    (suffix,) = [c for c in contenders_for(target, {}, [SpecChoice("suffix", K)]) if not c.plain]
    results = run_inprocess(
        [suffix], ByteCodec(), items, max_tokens=40, ignore_eos=True, repeats=3, progress=False, warmup=True
    )
    stats = {(r.prompt_id, r.repeat): r.stats for r in results}

    def drafting(prompt_id: str, repeat: int) -> tuple[int, int, int]:
        s = stats[(prompt_id, repeat)]
        return s.drafted, s.accepted, s.target_passes

    # the first request drafts exactly what it drafts with an empty memory: not its warm-up's output
    codec = ByteCodec()
    alone = Engine(target, SuffixFactory(vocab_size=VOCAB), SpecConfig(k=K))
    fresh = alone.generate(
        codec.encode("Once upon a time there was"), SamplingParams(), StopConfig(40, ignore_eos=True)
    )
    fresh.run()
    assert drafting("tale", 0) == (fresh.stats.drafted, fresh.stats.accepted, fresh.stats.target_passes)
    assert fresh.stats.tau < 2
    # within a repeat, the same text asked again drafts the first answer back (what a server does)
    assert stats[("tale-again", 0)].tau > 4
    # every repeat replays the first: no request saw its own prompt's output of an earlier repeat
    for item in PROMPTS:
        assert drafting(item["id"], 1) == drafting(item["id"], 2) == drafting(item["id"], 0), item["id"]
    assert len(suffix.pipeline.engine.proposer.cache.namespaces()) == 0  # each repeat's memory dropped after it
