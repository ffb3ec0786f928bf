"""`spekula tune --emit vllm|sglang|llama-server`: every emitted key is one the engine documents.

The tables below are the engines' documented names, written out here independently of
spekula.bench.emit (which cites the same sources next to its mapping), so a name the emitter invents
or misspells fails. Read from (commit of the copy read):
- vLLM: vllm/config/speculative.py, class SpeculativeConfig (vllm-project/vllm 002e77c1): method
  literals "ngram" / "draft_model" / "suffix", num_speculative_tokens, model, prompt_lookup_max/_min,
  suffix_decoding_max_tree_depth / _max_cached_requests / _max_spec_factor / _min_token_prob;
  docs/features/speculative_decoding/draft_model.md: `vllm serve ... --speculative-config '{...}'`.
- SGLang: docs/advanced_features/speculative_decoding.md (sgl-project/sglang fc6d4653, "Full Parameter
  Reference") and docs/advanced_features/suffix_decoding.md (597c4334).
- llama-server: docs/speculative.md (ggml-org/llama.cpp a71f4a0e: --spec-type and its types) and
  `llama-server --help` of current builds (common/arg.cpp), where --draft-max, --draft-min and
  --spec-ngram-size-n answer "the argument has been removed" and --spec-draft-n-max / --spec-draft-p-min /
  --spec-ngram-simple-size-n / --spec-ngram-simple-size-m / -md, --model-draft are the names.
"""

from __future__ import annotations

import json
import shlex

import pytest

from spekula.bench.emit import ENGINES, emit, parse_engines, read_tuned
from spekula.bench.runner import SpecChoice
from spekula.bench.tune import CONFIG_KEYS
from spekula.cli import main
from spekula.config import K_MAX
from spekula.errors import ConfigError

from benchkit import contenders_for, table, tune_over

VLLM_KEYS = {
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
}
VLLM_METHODS = {"ngram", "draft_model", "suffix"}
SGLANG_FLAGS = {
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-ngram-min-match-window-size",
    "--speculative-ngram-max-match-window-size",
    "--speculative-ngram-max-bfs-breadth",
    "--speculative-suffix-max-tree-depth",
    "--speculative-suffix-max-cached-requests",
    "--speculative-suffix-max-spec-factor",
    "--speculative-suffix-min-token-prob",
}
SGLANG_ALGORITHMS = {"NGRAM", "STANDALONE", "SUFFIX", "EAGLE", "EAGLE3"}
LLAMA_FLAGS = {
    "--spec-type",
    "-md",
    "--model-draft",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "--spec-draft-p-min",
    "--spec-ngram-simple-size-n",
    "--spec-ngram-simple-size-m",
    "--spec-ngram-mod-n-match",
    "--spec-ngram-mod-n-min",
    "--spec-ngram-mod-n-max",
}
LLAMA_TYPES = {"none", "draft-simple", "draft-mtp", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-mod"}
LLAMA_REMOVED = {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min", "--spec-ngram-size-n"}

DOCUMENTED = {"vllm": VLLM_KEYS, "sglang": SGLANG_FLAGS, "llama-server": LLAMA_FLAGS}
METHOD_KEY = {"vllm": ("method", VLLM_METHODS), "sglang": ("--speculative-algorithm", SGLANG_ALGORITHMS)}
METHOD_KEY["llama-server"] = ("--spec-type", LLAMA_TYPES)


def tuned(draft="ngram", k=4, **over):
    config = {
        "target": "/models/target.gguf",
        "draft": draft,
        "k": k,
        "k_max": K_MAX,
        "ngram_max": 4,
        "ngram_min": 1,
        "draft_confidence": None,
        "dtype": "float32",
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "backend": "llamacpp",
        "exact": False,
    }
    assert tuple(config) == CONFIG_KEYS  # the same shape tune writes
    return {**config, **over}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("draft", ["ngram", "suffix", "/models/draft.gguf", "none"])
@pytest.mark.parametrize("k", [4, "auto"])
def test_every_emitted_key_is_documented(engine, draft, k):
    e = emit(engine, tuned(draft, k), steps_by_k={3: 10, 5: 2})
    assert set(e.options) <= DOCUMENTED[engine], set(e.options) - DOCUMENTED[engine]
    assert not set(e.options) & LLAMA_REMOVED
    if e.options:
        key, methods = METHOD_KEY[engine]
        assert e.options[key] in methods
    argv = shlex.split(e.command())
    assert not set(argv) & LLAMA_REMOVED
    flags = {a for a in argv if a.startswith("-")}
    if engine != "vllm":  # every flag on the command line: the model's, or a documented one
        assert flags <= DOCUMENTED[engine] | {"-m", "--model-path"}, flags - DOCUMENTED[engine]


def test_vllm_ngram_is_prompt_lookup_with_the_measured_window():
    e = emit("vllm", tuned("ngram", 6, ngram_min=2, ngram_max=5))
    assert e.options == {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
    argv = shlex.split(e.command())
    assert argv[:3] == ["vllm", "serve", "/models/target.gguf"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == e.options


def test_sglang_counts_the_root_in_its_draft_tokens():
    ngram = emit("sglang", tuned("ngram", 4, ngram_min=1, ngram_max=3))
    assert ngram.options["--speculative-algorithm"] == "NGRAM"
    assert ngram.options["--speculative-num-draft-tokens"] == 5
    assert ngram.options["--speculative-ngram-max-match-window-size"] == 3
    assert any("bfs-breadth" in n for n in ngram.notes)  # a chain was measured, SGLang drafts a tree
    draft = emit("sglang", tuned("/models/draft.gguf", 3))
    assert draft.options == {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": "/models/draft.gguf",
        "--speculative-num-steps": 3,
        "--speculative-eagle-topk": 1,
        "--speculative-num-draft-tokens": 4,
    }


def test_llama_server_uses_the_current_flag_names():
    draft = emit("llama-server", tuned("/models/draft.gguf", 5, draft_confidence=0.4))
    assert draft.options == {
        "--spec-type": "draft-simple",
        "--model-draft": "/models/draft.gguf",
        "--spec-draft-n-max": 5,
        "--spec-draft-p-min": 0.4,  # spekula's draft_confidence is the same stopping rule
    }
    assert emit("llama-server", tuned("/models/draft.gguf", 5)).options["--spec-draft-p-min"] == 0.0
    ngram = emit("llama-server", tuned("ngram", 7, ngram_min=1, ngram_max=4))
    assert ngram.options == {
        "--spec-type": "ngram-simple",
        "--spec-ngram-simple-size-n": 4,
        "--spec-ngram-simple-size-m": 7,
    }
    assert any("one n-gram size" in n for n in ngram.notes)
    assert shlex.split(ngram.command())[:3] == ["llama-server", "-m", "/models/target.gguf"]


def test_no_equivalent_is_said_not_invented():
    e = emit("llama-server", tuned("suffix", None))
    assert e.options == {}
    assert any("no suffix decoding" in n for n in e.notes)
    assert shlex.split(e.command()) == ["llama-server", "-m", "/models/target.gguf"]
    assert "# note: llama-server has no suffix decoding" in e.text()
    vllm = emit("vllm", tuned("/models/draft.gguf", 3, draft_confidence=0.4))
    assert "confidence" not in json.dumps(vllm.options) and any("no confidence stop" in n for n in vllm.notes)


def test_suffix_maps_to_both_gpu_engines_with_the_measured_options():
    from spekula.config import SuffixOptions

    s = SuffixOptions()
    v = emit("vllm", tuned("suffix", None))
    assert v.options == {
        "method": "suffix",
        "num_speculative_tokens": K_MAX,  # a ceiling there as in spekula's k=auto
        "suffix_decoding_max_tree_depth": s.max_depth,
        "suffix_decoding_max_cached_requests": s.cache_entries,
        "suffix_decoding_max_spec_factor": s.spec_factor,
        "suffix_decoding_min_token_prob": s.min_token_prob,
    }
    g = emit("sglang", tuned("suffix", 8))
    assert g.options["--speculative-algorithm"] == "SUFFIX" and g.options["--speculative-num-draft-tokens"] == 9
    assert g.options["--speculative-suffix-max-tree-depth"] == s.max_depth


def test_k_auto_takes_the_k_the_controller_chose_most():
    e = emit("vllm", tuned("ngram", None), steps_by_k={"0": 50, "3": 9, "7": 4})  # keys as JSON writes them
    assert e.options["num_speculative_tokens"] == 3  # k = 0 steps drafted nothing: not a candidate
    assert any("chosen most often" in n for n in e.notes)
    unknown = emit("vllm", tuned("ngram", None, k_max=6))
    assert unknown.options["num_speculative_tokens"] == 6 and any("k_max=6" in n for n in unknown.notes)
    never = emit("vllm", tuned("ngram", None, k_max=6), steps_by_k={0: 40})
    assert never.options["num_speculative_tokens"] == 6


@pytest.mark.parametrize("engine", ENGINES)
def test_plain_decoding_emits_no_speculation(engine):
    e = emit(engine, tuned("none", 0))
    assert e.options == {}
    assert any("plain decoding" in n for n in e.notes)
    assert "--speculative" not in e.command() and "--spec-" not in e.command()


def test_parse_engines():
    assert parse_engines("vllm, llama-server") == ["vllm", "llama-server"]
    assert parse_engines("all") == list(ENGINES)
    with pytest.raises(ConfigError, match="--emit takes"):
        parse_engines("tgi")


def test_cli_emits_from_a_tuned_config(tmp_path, capsys):
    path = tmp_path / "tuned-config.json"
    path.write_text(json.dumps(tuned("ngram", 5)))
    out = tmp_path / "out"
    assert main(["tune", "--from-config", str(path), "--emit", "all", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    last = json.loads(printed.strip().splitlines()[-1])
    assert last["kind"] == "spekula-tune-emit" and set(last["emit"]) == set(ENGINES)
    assert last["emit"]["vllm"]["options"]["num_speculative_tokens"] == 5
    assert "--speculative-config" in printed and "--speculative-algorithm NGRAM" in printed
    for engine in ENGINES:
        text = (out / f"emit-{engine}.sh").read_text()
        assert text.startswith(f"# {engine}:") and text.strip().splitlines()[-1] == last["emit"][engine]["command"]


def test_cli_refuses_what_it_cannot_emit(tmp_path, capsys):
    path = tmp_path / "tuned-config.json"
    path.write_text(json.dumps(tuned()))
    assert main(["tune", "--from-config", str(path)]) == 2
    assert main(["tune", "--from-config", str(path), "--emit", "tgi"]) == 2
    (tmp_path / "bad.json").write_text("[1]")
    assert main(["tune", "--from-config", str(tmp_path / "bad.json"), "--emit", "vllm"]) == 2
    assert "--emit takes" in capsys.readouterr().err


def test_tune_writes_the_emission_of_what_it_recommends(tmp_path, unseen_workload):
    """The whole path: sweep, recommend, write tuned-config.json, tune.json and emit-<engine>.sh."""
    choices = [SpecChoice("same", 3), SpecChoice("same", None)]
    contenders = contenders_for(table(0, work=12), {"same": table(0)}, choices)
    outcome, text, paths = tune_over(
        contenders, choices, unseen_workload, tmp_path, runtime="native", emit=["vllm", "llama-server"]
    )
    assert outcome["recommended"].startswith("same k=") and outcome["runtime"] == "native"
    v = outcome["emit"]["vllm"]["options"]
    assert v["method"] == "draft_model" and v["model"] == "same" and v["num_speculative_tokens"] >= 1
    if outcome["config"]["k"] == 3:
        assert v["num_speculative_tokens"] == 3
    assert (tmp_path / "out" / "emit-llama-server.sh").read_text() in text + "\n"
    assert paths["emit_vllm"].endswith("emit-vllm.sh")
    # tune.json carries what --from-config needs for k=auto
    config, steps = read_tuned(paths["tune"])
    assert config == outcome["config"]
    row = next(r for r in outcome["table"] if r["name"] == outcome["recommended"])
    assert steps == {str(k): n for k, n in row["steps_by_k"].items()}
