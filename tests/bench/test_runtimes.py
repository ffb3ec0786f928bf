"""`--spec backend=RUNTIME`: contenders on different runtimes of the same target, interleaved in one run
against the same plain baseline. The runtimes here are in-memory tables (no weights)."""

from __future__ import annotations

import pytest

from spekula.bench.runner import DraftLoader, SpecChoice, build_contenders, parse_spec, run_inprocess
from spekula.bench.workloads import load_workload
from spekula.config import BackendConfig
from spekula.errors import ConfigError

from benchkit import UNSEEN, ByteCodec, table, write_jsonl


def test_parse_spec_takes_a_backend():
    (plain,) = parse_spec("draft=none,backend=native", "qwen", None)
    assert plain == SpecChoice("none", None, backend="native")
    assert plain.plain and plain.name == "plain backend=native"
    assert plain.to_dict()["backend"] == "native"
    sweep = parse_spec("draft=ngram,k=2/auto,backend=transformers", "qwen", None)
    assert [c.name for c in sweep] == ["ngram k=2 backend=transformers", "ngram k=auto backend=transformers"]
    assert parse_spec("draft=none,backend=native,name=native-plain", "qwen", None)[0].name == "native-plain"
    assert parse_spec("draft=ngram", "qwen", None)[0].backend is None  # the run's own runtime
    with pytest.raises(ConfigError, match="unknown backend 'cuda'"):
        parse_spec("draft=none,backend=cuda", "qwen", None)


def test_parse_spec_takes_exact():
    (exact,) = parse_spec("draft=suffix,exact=on", "qwen", None)
    assert exact.exact is True and exact.name == "suffix k=auto exact=on" and exact.to_dict()["exact"] is True
    assert parse_spec("draft=none,exact=off", "qwen", None)[0].name == "plain exact=off"
    assert parse_spec("draft=suffix", "qwen", None)[0].exact is None  # the run's --exact
    with pytest.raises(ConfigError, match="exact takes on or off"):
        parse_spec("draft=suffix,exact=yes", "qwen", None)
    with pytest.raises(ConfigError, match="exact"):
        parse_spec("loop=llama-cpp-python,exact=on", "qwen", None)


def test_exact_contenders_pair_with_plain_decoding_in_the_same_mode(tmp_path):
    """exact=on loads the target once more in exact mode (another table here); its speculative contender
    is compared for identity with plain decoding in exact mode, not with the run's plain decoding."""
    own, exact_target = table(0), table(1)

    def load_runtime(runtime, exact):
        assert (runtime, exact) == (None, True)
        return exact_target, lambda name: table(1)

    choices = [SpecChoice("none", 0, exact=True), SpecChoice("ngram", 3, exact=True)]
    contenders = build_contenders(own, ByteCodec(), choices, None, load_runtime)
    assert [c.name for c in contenders] == ["plain", "plain exact=on", "ngram k=3 exact=on"]
    assert [c.pipeline.target for c in contenders] == [own, exact_target, exact_target]
    items = load_workload(write_jsonl(tmp_path / "mine.jsonl", UNSEEN))
    results = run_inprocess(contenders, ByteCodec(), items, max_tokens=12, progress=False)
    by = {(r.config, r.prompt_id): r for r in results}
    for item in items:
        exact_plain, spec = by[("plain exact=on", item.id)], by[("ngram k=3 exact=on", item.id)]
        assert exact_plain.token_ids != by[("plain", item.id)].token_ids  # it ran on the other target
        assert spec.token_ids == exact_plain.token_ids and spec.identical is True


def test_a_backend_choice_without_a_runtime_loader_is_refused():
    with pytest.raises(ConfigError, match="backend=native"):
        build_contenders(table(0), ByteCodec(), [SpecChoice("none", 0, backend="native")], None)


def test_two_runtimes_in_one_run(tmp_path):
    """The run's runtime and a second one whose numbers differ (another table): each contender runs on
    its own runtime, every prompt under every contender, and a speculative contender on the second
    runtime is compared for identity with plain decoding on that runtime, not with the baseline."""
    own, other = table(0), table(1)
    loads: list[str] = []

    def load_runtime(runtime, exact):
        loads.append(runtime)
        assert exact is None
        return {"native": other}[runtime], lambda name: {"same-other": table(1)}[name]

    choices = [
        SpecChoice("ngram", 3),
        SpecChoice("none", 0, backend="native"),
        SpecChoice("same-other", 2, backend="native"),
    ]
    contenders = build_contenders(own, ByteCodec(), choices, None, load_runtime)
    assert [c.name for c in contenders] == [
        "plain",
        "ngram k=3",
        "plain backend=native",
        "same-other k=2 backend=native",
    ]
    assert [c.pipeline.target for c in contenders] == [own, own, other, other]
    items = load_workload(write_jsonl(tmp_path / "mine.jsonl", UNSEEN))
    results = run_inprocess(contenders, ByteCodec(), items, max_tokens=12, progress=False)
    assert len(results) == len(items) * len(contenders)
    by = {(r.config, r.prompt_id): r for r in results}
    for item in items:
        plain, other_plain = by[("plain", item.id)], by[("plain backend=native", item.id)]
        assert by[("ngram k=3", item.id)].identical is True  # lossless on the run's runtime
        assert other_plain.token_ids != plain.token_ids  # it really ran on the other table
        assert other_plain.identical is False  # a plain contender still compares with the baseline
        spec_other = by[("same-other k=2 backend=native", item.id)]
        assert spec_other.token_ids == other_plain.token_ids and spec_other.identical is True
        assert spec_other.speedup is not None  # speed compares with the baseline


def test_draft_loader_loads_each_runtime_once_and_shares_the_runs_own(monkeypatch):
    import spekula.pipeline

    target = table(0)
    loaded: list[tuple[str, str, str]] = []

    def fake_load_model(name, config):
        loaded.append((name, config.runtime, config.dtype))
        return table(0, name=f"{name}@{config.runtime}"), ByteCodec()

    monkeypatch.setattr(spekula.pipeline, "load_model", fake_load_model)
    run_config = BackendConfig(runtime="llamacpp", exact=False)
    loader = DraftLoader(
        "t", target, ByteCodec(), run_config, draft_config=lambda name, on: BackendConfig(runtime=on.runtime)
    )
    assert loader.runtime("llamacpp")[0] is target  # the run's own runtime: no second load
    assert loader.runtime(None, False)[0] is target  # the run's own runtime and mode
    native, drafts_native = loader.runtime("native")
    assert loader.runtime("native")[0] is native
    assert native.name == "t@native" and loaded == [("t", "native", "float32")]
    drafts_native("d")
    loader("d")  # the run's own drafts run beside the llama.cpp target
    assert loaded[1:] == [("d", "native", "float32"), ("d", "llamacpp", "float32")]
    exact = loader.runtime(None, True)[0]  # the run's runtime in exact mode: a second load
    assert exact.name == "t@llamacpp" and loaded[-1] == ("t", "llamacpp", "float32")
    assert loader.runtime("llamacpp", True)[0] is exact
    bf16 = DraftLoader("t", target, ByteCodec(), BackendConfig(dtype="bfloat16", runtime="native"))
    bf16.runtime("llamacpp")  # llama.cpp computes in the GGUF's own types: float32 is its placeholder
    assert loaded[-1] == ("t", "llamacpp", "float32")
