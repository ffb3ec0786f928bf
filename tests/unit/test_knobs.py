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
