"""`--spec loop=llama-cpp-python`: llama-cpp-python's own plain decoding as a bench contender, and
`--baseline` to put every ratio over it. The spec and the runner are tested with a stand-in for
llama_cpp.Llama over an in-memory table; the last test runs the real thing on smollm2-135m's GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spekula.bench.reference import LLAMA_CPP_PYTHON, LlamaCppPythonLoop, LlamaSettings, ReferenceContender
from spekula.bench.runner import PLAIN, SpecChoice, build_contenders, parse_spec, run_inprocess
from spekula.bench.workloads import load_workload
from spekula.config import SamplingParams
from spekula.errors import ConfigError

from benchkit import UNSEEN, VOCAB, ByteCodec, table, write_jsonl


def test_parse_spec_takes_a_loop_and_implies_plain_decoding():
    (ref,) = parse_spec("loop=llama-cpp-python", "qwen2.5-coder-0.5b", None)
    assert ref.plain and ref.loop == LLAMA_CPP_PYTHON and ref.name == LLAMA_CPP_PYTHON
    assert ref.to_dict()["loop"] == LLAMA_CPP_PYTHON and ref.to_dict()["draft"] == "none"
    assert parse_spec("draft=none,loop=llama-cpp-python,name=lcp", "ngram", 4)[0].name == "lcp"
    assert parse_spec("loop=llama-cpp-python,backend=llamacpp", "ngram", 4)[0].plain
    assert parse_spec("draft=ngram,k=4", "qwen", None)[0].loop == "spekula"  # spekula's engine by default


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("loop=llama-cpp-python,draft=ngram,k=4", "takes draft=none"),
        ("loop=llama-cpp-python,draft=ngram", "takes draft=none"),
        ("loop=llama-cpp-python,backend=native", "backend=native does not apply"),
        ("loop=llama-cpp-python,k_max=8", "k_max shape"),
        ("loop=llama-cpp-python,confidence=0.4", "confidence shape"),
        ("loop=vllm", "unknown loop 'vllm'"),
    ],
)
def test_a_loop_with_anything_but_plain_decoding_is_refused(spec, why):
    with pytest.raises(ConfigError, match=why):
        parse_spec(spec, "qwen", None)


def test_a_speculative_choice_on_another_loop_is_refused():
    with pytest.raises(ConfigError, match="takes draft=none"):
        SpecChoice("ngram", 3, loop=LLAMA_CPP_PYTHON)


def test_the_reference_needs_the_target_on_llamacpp():
    (ref,) = parse_spec("loop=llama-cpp-python", "ngram", None)
    with pytest.raises(ConfigError, match="backend=llamacpp"):  # no runtime loader: cannot reach a GGUF
        build_contenders(table(0), ByteCodec(), [ref], None)
    with pytest.raises(ConfigError, match="runs the target's GGUF"):
        LlamaSettings.of(table(0))


class TableLlama:
    """Stands in for llama_cpp.Llama: greedy over an in-memory table, with llama-cpp-python's state
    (input_ids[:n_tokens]: the tokens whose KV cells the previous call kept, which generate() reuses
    as far as the next prompt starts with them, all but its last token at most)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.n_tokens = 0
        self.input_ids = np.zeros(backend.context_length, dtype=np.intc)
        self.reused_at_call: list[int] = []  # the prompt tokens each generate() did not evaluate again

    def n_vocab(self) -> int:
        return VOCAB

    def reset(self) -> None:
        self.n_tokens = 0

    def generate(self, tokens, temp, repeat_penalty, reset):
        assert temp == 0.0 and repeat_penalty == 1.0 and reset
        tokens = list(tokens)
        kept = self.input_ids[: self.n_tokens].tolist()
        reused = next(
            (i for i, (a, b) in enumerate(zip(kept, tokens[:-1], strict=False)) if a != b),
            min(len(kept), len(tokens) - 1),
        )
        self.reused_at_call.append(reused)
        seq = self.backend.new_sequence()  # the table's logits depend on the prefix only: recompute it all
        try:
            logits = seq.forward(tokens, num_logits=1)
            self.input_ids[: len(tokens)] = tokens
            self.n_tokens = len(tokens)
            while True:
                token = int(logits[-1].argmax())
                yield token
                logits = seq.forward([token], num_logits=1)
                self.input_ids[self.n_tokens] = token
                self.n_tokens += 1
        finally:
            seq.release()


def reference_over(target, eos: frozenset[int] = frozenset(), prompt_cache: bool = True) -> ReferenceContender:
    loop = LlamaCppPythonLoop.__new__(LlamaCppPythonLoop)  # no GGUF: the table stands in for the model
    loop.prompt_cache = prompt_cache
    loop.settings = LlamaSettings(Path("table.gguf"), target.context_length, 1, 512, eos)
    loop.codec = ByteCodec()
    loop.llama = TableLlama(target)
    (choice,) = parse_spec("loop=llama-cpp-python", "ngram", None)
    return ReferenceContender(choice, loop)


def test_the_reference_runs_interleaved_and_can_be_the_baseline(tmp_path):
    target = table(0)
    ref = reference_over(target)
    contenders = build_contenders(target, ByteCodec(), [SpecChoice("ngram", 3)], None) + [ref]
    items = load_workload(write_jsonl(tmp_path / "mine.jsonl", UNSEEN))
    results = run_inprocess(
        contenders, ByteCodec(), items, max_tokens=10, repeats=2, progress=False, baseline=LLAMA_CPP_PYTHON
    )
    assert len(results) == 2 * len(items) * len(contenders)
    # each repeat starts from an empty cache (forget), and a request reuses only what it shares with the last one
    reused = ref.loop.llama.reused_at_call
    assert len(reused) == 1 + 2 * len(items) and reused[1] == reused[1 + len(items)] == 0
    by = {(r.config, r.prompt_id, r.repeat): r for r in results}
    for item in items:
        for repeat in (0, 1):
            mine, plain, spec = (by[(n, item.id, repeat)] for n in (LLAMA_CPP_PYTHON, PLAIN, "ngram k=3"))
            assert mine.token_ids == plain.token_ids and len(mine.token_ids) == 10
            assert mine.text == plain.text  # detokenized the same way
            assert mine.stats.output_tokens == 10 and mine.stats.ttft_s > 0 and mine.stats.total_s >= mine.stats.ttft_s
            assert mine.stats.prefill_s == 0 and mine.stats.decode_tokens_per_s is None  # see reference.py
            assert mine.stats.cached_tokens == reused[1 + repeat * len(items) + items.index(item)]
            assert plain.identical is True and plain.speedup is not None  # over the reference
            assert mine.speedup == pytest.approx(1.0)
            assert spec.identical is True  # lossless against spekula's plain decoding on its runtime
            assert spec.speedup == pytest.approx(spec.tokens_per_s / mine.tokens_per_s)


def test_without_the_prompt_cache_every_contender_prefills_every_prompt_whole(tmp_path):
    target = table(0)
    ref = reference_over(target, prompt_cache=False)
    contenders = build_contenders(target, ByteCodec(), [SpecChoice("ngram", 3)], None, prompt_cache=False) + [ref]
    items = load_workload(write_jsonl(tmp_path / "mine.jsonl", UNSEEN))
    results = run_inprocess(contenders, ByteCodec(), items, max_tokens=6, progress=False)
    assert set(ref.loop.llama.reused_at_call) == {0}
    assert all(r.stats.cached_tokens == 0 for r in results)
    assert not any(c.engine.prompt_cache.enabled for c in contenders if c is not ref)


def test_prompt_cache_any_rows_reaches_every_spekula_contender():
    target = table(0)
    choices = [SpecChoice("ngram", 3), SpecChoice("none", 0, label="plain-again")]
    for any_rows in (False, True):
        contenders = build_contenders(target, ByteCodec(), choices, None, any_rows=any_rows)
        assert len(contenders) == 3
        assert all(c.engine.prompt_cache.any_rows is any_rows for c in contenders)


def test_the_reference_stops_on_the_targets_eos_without_counting_it(tmp_path):
    target = table(0)
    prompt = ByteCodec().encode("def f(x):")
    stop_at = target.new_sequence().forward(prompt, num_logits=1)[-1].argmax().item()  # the first greedy token
    ref = reference_over(target, eos=frozenset({stop_at}))
    from spekula.config import StopConfig

    done = ref.start(prompt, SamplingParams(), StopConfig(max_tokens=8)).result()
    assert done.token_ids == [] and done.finish_reason == "stop" and done.stats.output_tokens == 0
    assert done.stats.target_passes == 1
    ignoring = ref.start(prompt, SamplingParams(), StopConfig(max_tokens=8, ignore_eos=True)).result()
    assert len(ignoring.token_ids) == 8 and ignoring.token_ids[0] == stop_at and ignoring.finish_reason == "length"


def test_the_reference_refuses_sampling_and_a_baseline_must_be_a_contender(tmp_path):
    target = table(0)
    contenders = build_contenders(target, ByteCodec(), [], None) + [reference_over(target)]
    items = load_workload(write_jsonl(tmp_path / "mine.jsonl", UNSEEN))
    with pytest.raises(ConfigError, match="greedy only"):
        run_inprocess(contenders, ByteCodec(), items, SamplingParams(temperature=0.7), progress=False)
    with pytest.raises(ConfigError, match="--baseline 'llama'"):
        run_inprocess(contenders, ByteCodec(), items, progress=False, baseline="llama")


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--spec", "loop=llama-cpp-python", "--baseline", "llama"], "--baseline 'llama' is not a configuration"),
        (["--baseline", "llama-cpp-python"], "choose one of plain"),
        (["--endpoint", "http://127.0.0.1:9/v1", "--baseline", "x"], "with --endpoint use --baseline-endpoint"),
    ],
)
def test_bench_refuses_a_baseline_it_does_not_run_before_loading_anything(argv, why, capsys):
    from spekula.cli import main

    assert main(["bench", "--target", "no-such-model", "--no-progress", *argv]) == 2  # the target is never loaded
    assert why in capsys.readouterr().err


def test_audit_refuses_another_loop(capsys):
    from spekula.cli import main

    assert main(["audit", "--target", "no-such-model", "--spec", "loop=llama-cpp-python", "--no-progress"]) == 2
    assert "loop= is a `spekula bench` contender only" in capsys.readouterr().err


@pytest.mark.model
def test_llama_cpp_python_and_spekula_plain_decode_the_same_gguf_alike(tmp_path, capsys, monkeypatch):
    """The real loop on smollm2-135m's GGUF, through the CLI: same greedy tokens as spekula's plain
    decoding on llama.cpp, the report's ratios over it, and every request's prompt evaluated whole
    (the second repeat of a prompt would otherwise reuse llama-cpp-python's cached prefix)."""
    import llama_cpp

    from spekula.cli import main

    evals: list[tuple[int, int]] = []  # (KV cells kept when an eval began, tokens evaluated)
    real_eval = llama_cpp.Llama.eval

    def eval_spy(self, tokens):
        evals.append((self.n_tokens, len(tokens)))
        return real_eval(self, tokens)

    monkeypatch.setattr(llama_cpp.Llama, "eval", eval_spy)
    rc = main(
        [
            "bench",
            "--target",
            "smollm2-135m",
            "--backend",
            "llamacpp",
            "--threads",
            "1",
            "--spec",
            "loop=llama-cpp-python",
            "--baseline",
            LLAMA_CPP_PYTHON,
            "--categories",
            "code-editing,open-chat",
            "--per-category",
            "1",
            "--max-tokens",
            "6",
            "--repeats",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["baseline"] == LLAMA_CPP_PYTHON
    assert f"baseline: {LLAMA_CPP_PYTHON}" in out and f"Speedups are over {LLAMA_CPP_PYTHON}." in out
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    by = {(r["config"], r["prompt_id"], r["repeat"]): r for r in result["requests"]}
    mine = [r for r in result["requests"] if r["config"] == LLAMA_CPP_PYTHON]
    assert len(mine) == 4 and all(r["error"] is None and r["token_ids"] for r in mine)
    for r in mine:
        plain = by[(PLAIN, r["prompt_id"], r["repeat"])]
        assert plain["token_ids"] == r["token_ids"] and plain["identical"] is True
        assert plain["speedup"] is not None and plain["ttft_s"] > 0 and r["ttft_s"] > 0
    plain_summary = result["summary"][PLAIN]["overall"]
    assert plain_summary["speedup"]["n"] == 4 and plain_summary["identical_to_plain"] == 4
    prompt_evals = [e for e in evals if e[1] > 1]  # one per request (warm-up + 4)
    assert len(prompt_evals) == 5 and prompt_evals[1][0] == prompt_evals[3][0] == 0  # each repeat from empty
    in_order = sorted(mine, key=lambda r: r["order"])
    assert [kept + n for kept, n in prompt_evals[1:]] == [r["stats"]["prompt_tokens"] for r in in_order]
