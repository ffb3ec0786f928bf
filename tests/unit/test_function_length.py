"""Every function in src/spekula fits one screen: at most MAX_LINES lines from its `def` to its last line,
or it says at its top why it is longer, in a comment with MARKER ("# long: <why>") between its `def`
and its first statement after the docstring. Read statically with `ast`; nested functions count on
their own (and inside the function that holds them).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "spekula"
MAX_LINES = 60
MARKER = "# long:"


def too_long(source: str, max_lines: int = MAX_LINES) -> list[tuple[int, str, int]]:
    """(line, name, length) of each function of `source` longer than max_lines with no MARKER at its top."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length <= max_lines:
            continue
        body = node.body
        has_docstring = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
        first = body[1] if has_docstring and len(body) > 1 else body[0]
        top = lines[node.lineno - 1 : max(first.lineno - 1, node.lineno)]  # signature, docstring, comments
        if not any(MARKER in line for line in top):
            found.append((node.lineno, node.name, length))
    return found


def test_every_function_fits_a_screen_or_says_why_not():
    offenders = [
        f"{path.relative_to(SRC.parent)}:{line} {name} ({length} lines)"
        for path in sorted(SRC.rglob("*.py"))
        for line, name, length in too_long(path.read_text())
    ]
    assert not offenders, (
        f"functions over {MAX_LINES} lines: split them, or say why at their top ('{MARKER} ...'):\n"
        + "\n".join(offenders)
    )


def test_the_rule_catches_a_long_function_and_accepts_a_reason():
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    long_one = 'def f():\n    """Doc."""\n' + body
    assert too_long(long_one, max_lines=4) == [(1, "f", 5)]
    assert too_long(long_one, max_lines=5) == []
    reason = 'def f():\n    """Doc."""\n    # long: a flat table\n' + body
    assert too_long(reason, max_lines=4) == []
    late = 'def f():\n    """Doc."""\n    x = 0\n    # long: too late, after the first statement\n' + body
    assert too_long(late, max_lines=4) == [(1, "f", 7)]
