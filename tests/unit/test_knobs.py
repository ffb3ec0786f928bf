"""spekula.knobs: an option declared once gives its flag, its default, its help and its check."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from spekula.errors import ConfigError
from spekula.knobs import (
    add_knob_flags,
    check_knobs,
    knob,
    knob_of,
    knob_values,
    knobs,
    markdown_table,
    write_tables,
)
from spekula.server.settings import ServerSettings


@dataclass(frozen=True)
class Toy:
    width: int = knob(4, "--width", "rows a pass (default {default})", low=1, high=64)
    timeout_s: float = knob(2.5, "--timeout", "seconds (default {default})", low=0, low_open=True, noun="seconds")
    name: str | None = knob(None, "--name", "a name", kind=str)
    loud: bool = knob(False, "--loud", "say more")
    derived: int = 0  # no knob: nothing here is derived from it

    def __post_init__(self) -> None:
        check_knobs(self)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_knob_flags(parser, Toy)
    return parser.parse_args(list(argv))


def test_the_flags_come_from_the_declarations():
    assert Toy(**knob_values(Toy, parse())) == Toy()  # every default as declared
    args = parse("--width", "8", "--timeout", "0.5", "--name", "n", "--loud")
    assert Toy(**knob_values(Toy, args)) == Toy(width=8, timeout_s=0.5, name="n", loud=True)
    assert parse("--no-loud").loud is False
    assert [name for name, _, _ in knobs(Toy)] == ["width", "timeout_s", "name", "loud"]
    parser = argparse.ArgumentParser()
    add_knob_flags(parser, Toy)
    assert "rows a pass (default 4)" in " ".join(parser.format_help().split())


@pytest.mark.parametrize(
    "options, words",
    [
        ({"width": 0}, "--width must be an integer >= 1 and <= 64, got 0"),
        ({"width": 65}, "--width must be an integer >= 1 and <= 64, got 65"),
        ({"width": True}, "--width must be an integer"),  # a bool is no integer
        ({"width": 2.0}, "--width must be an integer"),
        ({"timeout_s": 0}, "--timeout must be seconds > 0, got 0"),
        ({"timeout_s": float("nan")}, "--timeout must be seconds > 0"),
        ({"timeout_s": float("inf")}, "--timeout must be seconds > 0"),
        ({"name": 3}, "--name must be a string"),
        ({"loud": 1}, "--loud must be true or false"),
    ],
)
def test_a_bad_value_names_its_flag_and_the_allowed_range(options, words):
    with pytest.raises(ConfigError) as e:
        Toy(**options)
    assert words in str(e.value)


def test_only_knobs_are_declared_so():
    with pytest.raises(KeyError, match="derived is not a knob"):
        knob_of(Toy, "derived")
    with pytest.raises(TypeError, match="a knob is one of"):
        knob([1], "--list", "a list")
    with pytest.raises(TypeError, match="--maybe: a knob whose default is None needs its kind"):
        knob(None, "--maybe", "unset by default")


def test_every_server_flag_is_a_declared_setting_and_the_docs_table_is_made_from_them(tmp_path):
    """`spekula serve`'s server flags are ServerSettings' knobs, and docs/SERVER.md holds the table made from
    them (`python -m spekula.server.settings` rewrites it)."""
    from pathlib import Path

    from spekula.cli import parser_and_commands

    serve = parser_and_commands()[1]["serve"]
    group = next(g for g in serve._action_groups if g.title == "server")
    flags = {s for a in group._group_actions for s in a.option_strings if not s.startswith("--no-")}
    declared = {meta.flag for _, meta, _ in knobs(ServerSettings)}
    assert declared <= flags and flags - declared == {"--log-level"}
    docs = Path(__file__).resolve().parents[2] / "docs" / "SERVER.md"
    copy = tmp_path / "SERVER.md"
    copy.write_text(docs.read_text())
    assert not write_tables(copy, {"ServerSettings": ServerSettings}), (
        "run: .venv/bin/python -m spekula.server.settings"
    )
    assert markdown_table(ServerSettings) in docs.read_text()
    stale = tmp_path / "stale.md"
    stale.write_text("x\n<!-- knobs: ServerSettings -->\n| old |\n<!-- /knobs -->\ny\n")
    assert write_tables(stale, {"ServerSettings": ServerSettings})
    assert (
        stale.read_text() == f"x\n<!-- knobs: ServerSettings -->\n{markdown_table(ServerSettings)}<!-- /knobs -->\ny\n"
    )


def test_the_docs_tables_of_the_speculation_options_are_made_from_their_declarations(tmp_path):
    """docs/OPTIONS.md holds SpecConfig's and SuffixOptions' tables as their declarations make them
    (`python -m spekula.options` rewrites them), every flag in its table."""
    from pathlib import Path

    from spekula.options import OPTION_TABLES

    docs = Path(__file__).resolve().parents[2] / "docs" / "OPTIONS.md"
    copy = tmp_path / "OPTIONS.md"
    copy.write_text(docs.read_text())
    assert not write_tables(copy, OPTION_TABLES), "run: .venv/bin/python -m spekula.options"
    for cls in OPTION_TABLES.values():
        table = markdown_table(cls)
        assert all(f"| `{meta.flag}` |" in table for _, meta, _ in knobs(cls)) and table in docs.read_text()


def test_open_bounds_and_flags_given_only():
    @dataclass(frozen=True)
    class Odds:
        p: float | None = knob(None, "--p", "a probability", kind=float, low=0, low_open=True, high=1, high_open=True)

        def __post_init__(self) -> None:
            check_knobs(self)

    assert knob_of(Odds, "p").bounds() == "> 0 and < 1" and Odds(0.5).p == 0.5 and Odds().p is None
    for bad in (0, 1, 1.5):
        with pytest.raises(ConfigError, match=rf"--p must be a number > 0 and < 1, got {bad}"):
            Odds(bad)
    parser = argparse.ArgumentParser()
    add_knob_flags(parser, Toy, prefix="toy_", given_only=True)
    args = parser.parse_args(["--width", "8", "--no-loud"])
    assert (args.toy_width, args.toy_timeout_s, args.toy_loud) == (8, None, False)  # not given: None
    assert knob_values(Toy, args, prefix="toy_", given_only=True) == {"width": 8, "loud": False}
    assert knob_values(Toy, argparse.Namespace(), prefix="toy_", given_only=True) == {}  # a command without them
    assert "rows a pass (default 4)" in " ".join(parser.format_help().split())  # the declared default, still


# -- the speculation knobs: SpecConfig's and SuffixOptions' declarations and what is derived from them ------------

MODEL_COMMANDS = ("generate", "serve", "bench", "tune", "audit")  # every command that runs models


def flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def bad_value(meta):
    """A value each knob refuses: under its low bound, else of the wrong kind."""
    if meta.kind in (int, float) and meta.low is not None:
        return meta.low if meta.low_open else meta.low - 1
    return "x" if meta.kind is not str else 3


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_every_speculation_knob_is_a_flag_with_its_declared_default(command):
    from spekula.cli import parser_and_commands
    from spekula.config import SpecConfig, SuffixOptions

    parser = parser_and_commands()[1][command]
    actions = flag_actions(parser)
    for name, meta, default in knobs(SpecConfig):
        action = actions[meta.flag]
        assert (action.dest, action.default) == (name, default), meta.flag
        assert action.help == meta.help.format(default=f"{default:.3g}" if isinstance(default, float) else default)
    suffix = [meta.flag for _, meta, _ in knobs(SuffixOptions)]
    if command in ("generate", "serve"):  # not given: None, so a flag given with another --draft is refused
        for name, meta, default in knobs(SuffixOptions):
            action = actions[meta.flag]
            assert (action.dest, action.default) == (f"suffix_{name}", None), meta.flag
            assert f"(default {default:g}" in action.help, meta.flag
        assert set(suffix) == {s for s in actions if s.startswith("--suffix-")}  # and no --suffix-* flag besides
    else:  # bench and tune measure suffix lookup with its defaults
        assert not set(suffix) & set(actions)


def test_the_parsed_flags_are_the_spec_config():
    from spekula.cli import parser_and_commands
    from spekula.config import SpecConfig, SuffixOptions
    from spekula.options import spec_from_args

    parser = parser_and_commands()[0]
    # the flags' defaults are the library's: k auto for both
    assert spec_from_args(parser.parse_args(["generate", "--draft", "ngram"])) == SpecConfig()
    assert spec_from_args(parser.parse_args(["generate", "--k", "4", "--draft", "ngram"])) == SpecConfig(k=4)
    args = parser.parse_args(
        ["generate", "--draft", "suffix", "--k", "auto", "--k-max", "8", "--ngram-max", "3", "--ngram-min", "2"]
        + ["--draft-confidence", "0.4", "--no-prompt-cache", "--suffix-cache-mb", "0.5", "--suffix-max-depth", "9"]
    )
    assert spec_from_args(args) == SpecConfig(
        k=None,
        k_max=8,
        ngram_max=3,
        ngram_min=2,
        draft_confidence=0.4,
        prompt_cache=False,
        suffix=SuffixOptions(cache_mb=0.5, max_depth=9),
    )
    assert spec_from_args(args).suffix.cache_bytes == 1 << 19  # the cache counts bytes; a user sets MiB


@pytest.mark.parametrize("config", ["SpecConfig", "SuffixOptions"])
def test_a_bad_speculation_value_names_its_flag_and_range(config):
    from spekula import config as module

    cls = getattr(module, config)
    for name, meta, _ in knobs(cls):
        with pytest.raises(ConfigError) as e:
            cls(**{name: bad_value(meta)})
        bounds = meta.bounds()
        assert str(e.value).startswith(f"{meta.flag} must be ") and bounds in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match=r"--ngram-max must be an integer >= --ngram-min \(3\), got 2"):
        module.SpecConfig(ngram_min=3, ngram_max=2)


def test_bench_spec_keys_and_defaults_are_spec_configs():
    """--spec's keys for SpecConfig's knobs, SpecChoice's defaults, choice_with_defaults' and parse_spec's are
    the declarations'; a bad --spec value is refused by the declared bounds, naming the key."""
    import inspect

    from spekula.bench.runner import CHOICE_KNOBS, SPEC_KEYS, SpecChoice, choice_with_defaults, parse_spec
    from spekula.bench.tune import CONFIG_KEYS, sweep_choices
    from spekula.config import SpecConfig

    declared = {name: default for name, _, default in knobs(SpecConfig)}
    assert set(CHOICE_KNOBS) <= set(SPEC_KEYS) and set(CHOICE_KNOBS.values()) <= set(declared)
    assert set(CHOICE_KNOBS.values()) <= set(CONFIG_KEYS)  # tune's config records what each choice sets
    choice = SpecChoice("ngram", 4)
    assert choice.knob_values() == {name: declared[name] for name in CHOICE_KNOBS.values()}
    for key, name in CHOICE_KNOBS.items():
        assert getattr(choice, key) == declared[name]
        for function in (choice_with_defaults, parse_spec, sweep_choices):
            assert inspect.signature(function).parameters[key].default == declared[name], (function, key)
    assert parse_spec("draft=ngram,k=4", "d", None) == [choice]
    for key in ("k_max", "ngram_max", "ngram_min", "confidence"):
        meta = knob_of(SpecConfig, CHOICE_KNOBS[key])
        with pytest.raises(ConfigError, match=rf"{key} must be .*{meta.bounds()}"):
            parse_spec(f"draft=qwen,k=auto,{key}={bad_value(meta)}", "d", None)


def test_tune_records_the_spec_knobs_a_configuration_sets():
    from spekula.bench.runner import CHOICE_KNOBS, SpecChoice
    from spekula.bench.tune import CONFIG_KEYS, tuned_config
    from spekula.config import SamplingParams

    choice = SpecChoice("qwen", None, ngram_max=3, confidence=0.4, k_max=8)
    config = tuned_config(choice, "t", "float32", SamplingParams())
    assert tuple(config) == CONFIG_KEYS
    assert {name: config[name] for name in CHOICE_KNOBS.values()} == choice.knob_values()
    assert (config["k_max"], config["ngram_max"], config["draft_confidence"]) == (8, 3, 0.4)


def test_emit_fills_a_missing_key_with_the_declared_default():
    from spekula.bench.emit import emit
    from spekula.config import SpecConfig

    spec = SpecConfig()
    options = emit("vllm", {"draft": "ngram", "k": 4}).options
    assert (options["prompt_lookup_max"], options["prompt_lookup_min"]) == (spec.ngram_max, spec.ngram_min)
    assert emit("vllm", {"draft": "ngram", "k": "auto"}).options["num_speculative_tokens"] == spec.k_max
