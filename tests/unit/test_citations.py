"""Evidence lives outside the code, and the code's pointers to it hold: every decision record, script and
docs/BENCHMARKS.md section that src/, scripts/ or tests/ cite exists, and no file of the repository names a path
of the machine it was written on (a result records paths from the checkout or $SPEKULA_CACHE instead)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = ("__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache")
CODE_SUFFIXES = {".py", ".sh", ".md"}
TEXT_SUFFIXES = CODE_SUFFIXES | {".txt", ".json", ".jsonl", ".log", ".toml", ".gz"}

DECISION = re.compile(r"docs/decisions/[\w.-]+?\.md")
SCRIPT = re.compile(r"(?<![\w/])scripts/(?:experiments/)?\w+\.(?:py|sh)")
SECTION = re.compile(r'docs/BENCHMARKS\.md,\s+"([^"]+)"')  # a section cited by its heading, in quotes
MACHINE_PATH = re.compile(r"/(?:work|root|home)/")


def files(folders: tuple[str, ...], suffixes: set[str]) -> list[Path]:
    found = []
    for folder in folders:
        for path in (ROOT / folder).rglob("*"):
            parts = path.relative_to(ROOT).parts
            if (
                path.is_file()
                and path.suffix in suffixes
                and not any(p in SKIPPED or p.endswith(".egg-info") for p in parts)
            ):
                found.append(path)
    return found


def text(path: Path) -> str:
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    return path.read_text(encoding="utf-8", errors="replace")


def benchmark_headings() -> list[str]:
    lines = (ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()
    return [line.lstrip("#").strip() for line in lines if line.startswith("#")]


def test_every_cited_decision_record_and_script_exists():
    citations = {
        (str(path.relative_to(ROOT)), cited)
        for path in files(("src", "scripts", "tests"), CODE_SUFFIXES)
        for cited in DECISION.findall(text(path)) + SCRIPT.findall(text(path))
    }
    missing = sorted(f"{where} cites {cited}" for where, cited in citations if not (ROOT / cited).is_file())
    assert len(citations) > 0 and missing == []


def test_every_cited_benchmarks_section_is_a_heading_of_it():
    headings = benchmark_headings()
    cited = 0
    missing = set()
    for path in files(("src", "scripts", "tests"), CODE_SUFFIXES):
        for section in SECTION.findall(text(path)):
            section = " ".join(re.sub(r"\n\s*#?", " ", section).split())  # wrapped over docstring or comment lines
            cited += 1
            if not any(h.startswith(section) for h in headings):
                missing.add(f"{path.relative_to(ROOT)} cites {section!r}")
    assert cited > 0 and sorted(missing) == []


def test_no_file_names_a_path_of_the_machine_it_was_written_on():
    named = [
        str(path.relative_to(ROOT))
        for path in files(("docs", "scripts", "src", "tests"), TEXT_SUFFIXES)
        if MACHINE_PATH.search(text(path))
    ]
    assert named == []
