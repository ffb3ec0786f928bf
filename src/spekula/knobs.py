"""A knob declared once: a dataclass field whose metadata carries its flag, bounds and help, from which the
command-line flag, the check of a value and the flag a message names are all derived.

    @dataclass(frozen=True)
    class Settings:
        port: int = knob(8000, "--port", "(default {default}; 0 = any free port)", low=0, high=65535)

        def __post_init__(self) -> None:
            check_knobs(self)

`add_knob_flags(group, Settings)` adds `--port` (type int, default 8000, the help with {default} filled in),
`knob_values(Settings, args)` reads the parsed flags back into the fields' names, and `check_knobs` refuses a
value of the wrong kind or out of bounds with a ConfigError that names the flag and the allowed range. A field
without `knob` metadata is none of this module's business (a nested config, a derived value).

Declared so: ServerSettings (spekula.server.settings), SpecConfig and SuffixOptions (spekula.config). This module
imports no other config, so spekula.config can declare its knobs here; is_int and is_number, the checks of an
integer and of a number that every option uses, live here for that reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from spekula.errors import ConfigError

KINDS = (int, float, str, bool)


def is_int(value: object) -> TypeGuard[int]:
    """An integer, and not a bool (to Python True is the integer 1; to a user it is never a count).
    The one such check: every option, request field and file field that takes an integer uses it."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """A finite int or float, and not a bool (NaN passes no range check, so it must fail this one)."""
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))  # an int of any size is finite


@dataclass(frozen=True)
class Knob:
    flag: str  # the command-line flag, "--max-running"
    help: str  # may use {default}
    kind: type  # int, float, str or bool (a bool is an on/off switch: --flag / --no-flag)
    low: float | None = None  # inclusive bounds of a number
    high: float | None = None
    low_open: bool = False  # the low bound itself is refused (a timeout > 0)
    high_open: bool = False  # ... and the high one (a probability < 1)
    optional: bool = False  # None is a value (the field's "not set")
    metavar: str | None = None
    noun: str | None = None  # what a message calls a value ("a number of seconds"); default from kind

    def bounds(self) -> str:
        low = "" if self.low is None else (f"> {self.low:g}" if self.low_open else f">= {self.low:g}")
        high = "" if self.high is None else (f"< {self.high:g}" if self.high_open else f"<= {self.high:g}")
        return " and ".join(b for b in (low, high) if b)

    def check(self, value: Any) -> None:
        if value is None and self.optional:
            return
        ok = {int: is_int, float: is_number, str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool)}
        noun = self.noun or {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[self.kind]
        if not ok[self.kind](value):
            raise ConfigError(f"{self.flag} must be {noun}{self._range()}, got {value!r}")
        if self.kind in (int, float):
            too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
            too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
            if too_low or too_high:
                raise ConfigError(f"{self.flag} must be {noun}{self._range()}, got {value!r}")

    def _range(self) -> str:
        bounds = self.bounds()
        return f" {bounds}" if bounds else ""


def knob(
    default: Any,
    flag: str,
    help: str,
    *,
    kind: type | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    metavar: str | None = None,
    noun: str | None = None,
) -> Any:
    """A dataclass field declared as a knob (see the module's docstring). kind: from the default unless it is
    None (then kind is needed, and None is a value)."""
    if kind is None and default is None:
        raise TypeError(f"{flag}: a knob whose default is None needs its kind (kind=int, float, str or bool)")
    kind = kind or type(default)
    if kind not in KINDS:
        raise TypeError(f"a knob is one of {[k.__name__ for k in KINDS]}, not {kind.__name__}")
    meta = Knob(flag, help, kind, low, high, low_open, high_open, optional=default is None, metavar=metavar, noun=noun)
    return field(default=default, metadata={"knob": meta})


def knobs(cls: type) -> Iterator[tuple[str, Knob, Any]]:
    """(field name, its Knob, its default) for each knob of a dataclass, in declaration order."""
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("knob")
        if meta is not None:
            yield f.name, meta, f.default


def check_knobs(obj: Any) -> None:
    """Every knob's value of a dataclass instance: of its kind and within its bounds."""
    for name, meta, _ in knobs(type(obj)):
        meta.check(getattr(obj, name))


def knob_of(cls: type, name: str) -> Knob:
    """The Knob of one field of cls."""
    found = next((meta for n, meta, _ in knobs(cls) if n == name), None)
    if found is None:
        raise KeyError(f"{cls.__name__}.{name} is not a knob")
    return found


def add_knob_flags(group: Any, cls: type, *, prefix: str = "", given_only: bool = False) -> None:
    """One command-line flag per knob of cls, its default and help from the declaration. Its dest is the
    field's name after `prefix` (a nested config's knobs: suffix_max_depth). given_only: every flag's default
    is None, so that a flag not given can be told from one given its default (the help still says the
    declared default; knob_values then leaves out the flags not given)."""
    for name, meta, default in knobs(cls):
        text = meta.help.format(default=_shown(default))
        dest, parsed = prefix + name, None if given_only else default
        if meta.kind is bool:
            group.add_argument(meta.flag, dest=dest, action=argparse.BooleanOptionalAction, default=parsed, help=text)
            continue
        kind = None if meta.kind is str else meta.kind
        metavar = meta.metavar or meta.flag.lstrip("-").replace("-", "_").upper()
        group.add_argument(meta.flag, dest=dest, type=kind, default=parsed, help=text, metavar=metavar)


def knob_values(cls: type, args: argparse.Namespace, *, prefix: str = "", given_only: bool = False) -> dict[str, Any]:
    """The parsed flags of cls's knobs, by field name (for cls(**values, ...)); prefix and given_only as
    add_knob_flags made them (given_only: only the flags given; a command without these flags gave none)."""
    if given_only:
        values = {name: getattr(args, prefix + name, None) for name, _, _ in knobs(cls)}
        return {name: value for name, value in values.items() if value is not None}
    return {name: getattr(args, prefix + name) for name, _, _ in knobs(cls)}


def markdown_table(cls: type) -> str:
    """The knobs of cls as a table (flag, default, allowed values, what it does): docs' option tables are this."""
    rows = ["| flag | default | allowed | what it does |", "|---|---|---|---|"]
    for _, meta, default in knobs(cls):
        allowed = "on / off" if meta.kind is bool else meta.bounds() or ("text" if meta.kind is str else "")
        shown = (
            "off" if default is False else "on" if default is True else "none" if default is None else _shown(default)
        )
        text = meta.help.format(default=_shown(default)).replace("|", "\\|")
        rows.append(f"| `{meta.flag}` | {shown} | {allowed} | {text} |")
    return "\n".join(rows) + "\n"


def write_tables(path: Path, tables: dict[str, type]) -> bool:
    """Replace each `<!-- knobs: NAME -->` ... `<!-- /knobs -->` block in the file at path by NAME's table;
    returns whether the file changed."""
    text = path.read_text()
    new = text
    for name, cls in tables.items():
        start, end = f"<!-- knobs: {name} -->\n", "<!-- /knobs -->"
        head, found, rest = new.partition(start)
        if not found:
            raise ValueError(f"{path} has no {start.strip()} block")
        new = head + start + markdown_table(cls) + end + rest.partition(end)[2]
    if new != text:
        path.write_text(new)
    return new != text


def _shown(default: Any) -> str:
    return f"{default:.3g}" if isinstance(default, float) else str(default)
