"""Optional dependencies: the core runs without any extra, a missing extra is named, and pyproject.toml,
requirements/base.txt and spekula.extras agree on which package belongs where."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from spekula.extras import EXTRAS, MissingExtra, needs_extra, require_extra

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = PYPROJECT["optional-dependencies"]


def dist_name(requirement: str) -> str:
    """'prometheus-client>=0.20' -> 'prometheus-client' (normalised as pip compares names)."""
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def dists(requirements: list[str]) -> set[str]:
    return {dist_name(r) for r in requirements if not r.startswith("spekula[")}


def core_closure() -> set[str]:
    """The distributions a core-only install holds: the core dependencies and theirs, as installed here."""
    seen: set[str] = set()
    todo = list(dists(PYPROJECT["dependencies"]))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requirements:
            r = Requirement(text)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(dist_name(r.name))
    return seen


def not_in_core() -> list[str]:
    """The modules of the extras (and the test extra's httpx) that a core-only install lacks. Some come
    with the core anyway (transformers needs tqdm, accelerate psutil): those stay importable."""
    core = core_closure()
    provided_by = metadata.packages_distributions()
    modules = {m for names in EXTRAS.values() for m in names} | {"httpx"}
    return sorted(m for m in modules if not {dist_name(d) for d in provided_by.get(m, [])} & core)


def test_every_extra_of_the_code_is_an_extra_of_pyproject_with_the_packages_that_install_its_modules():
    installed_by = {m: {dist_name(d) for d in names} for m, names in metadata.packages_distributions().items()}
    for extra, modules in EXTRAS.items():
        assert extra in OPTIONAL, f"pyproject.toml has no extra {extra!r}"
        wanted = dists(OPTIONAL[extra])
        for module in modules:
            if module in installed_by:  # a module not installed here cannot be traced to its distribution
                assert installed_by[module] & wanted, f"{module} is not installed by spekula[{extra}] ({wanted})"
    assert set(OPTIONAL) == set(EXTRAS) | {"test", "all"}
    assert OPTIONAL["all"] == [f"spekula[{','.join([*EXTRAS, 'test'])}]"]
    assert not dists(PYPROJECT["dependencies"]) & {d for r in OPTIONAL.values() for d in dists(r)}


def test_make_installs_the_core_and_every_extra():
    """base.txt by pip; llamacpp.txt by spekula.llamacpp_build (built for this CPU), never by pip's default."""
    base, llamacpp = (pinned_in(ROOT / "requirements" / name) for name in ("base.txt", "llamacpp.txt"))
    assert llamacpp == {"llama-cpp-python"} and not base & llamacpp
    pinned = base | llamacpp
    declared = dists(PYPROJECT["dependencies"]) | {d for r in OPTIONAL.values() for d in dists(r)}
    assert pinned == declared


def pinned_in(path) -> set[str]:
    lines = path.read_text().splitlines()
    return {dist_name(line) for line in lines if line.strip() and not line.startswith("#")}


def test_a_missing_extra_is_named_with_the_command_that_installs_it():
    with pytest.raises(MissingExtra) as caught:
        with needs_extra("server", "spekula serve"):
            raise ModuleNotFoundError("No module named 'uvicorn.config'", name="uvicorn.config")
    message = str(caught.value)
    assert message.startswith("spekula serve needs uvicorn") and "pip install 'spekula[server]'" in message
    assert isinstance(caught.value, ImportError) and caught.value.extra == "server"


def test_a_module_the_extra_does_not_install_is_not_blamed_on_it():
    with pytest.raises(ModuleNotFoundError) as caught:
        with needs_extra("bench"):
            raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")
    assert not isinstance(caught.value, MissingExtra)


def test_require_extra_checks_every_module_before_any_work(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # how Python marks a module as not importable
    with pytest.raises(MissingExtra, match=re.escape("spekula bench needs psutil, which the 'bench' extra")):
        require_extra("bench", "spekula bench")


def run_without_extras(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter where no extra's module can be imported (a core-only install)."""
    block = f"import sys\nfor m in {not_in_core()!r}:\n    sys.modules[m] = None\n"
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, timeout=300)


def test_the_core_imports_and_the_commands_name_their_extra_without_any_extra(tmp_path):
    core = sorted(
        ".".join(p.relative_to(ROOT / "src").with_suffix("").parts)
        for p in (ROOT / "src" / "spekula").rglob("*.py")
        if p.parent.name not in ("server", "bench") and p.name != "__main__.py"
    )
    code = f"""
import importlib, sys
for name in {core!r} + ["spekula.server.cli", "spekula.bench.cli"]:
    importlib.import_module(name.removesuffix(".__init__"))
from spekula.cli import main
assert main(["serve", "--port", "0", "--target", "no-such-model"]) == 2
assert main(["bench", "--target", "no-such-model", "--out", {str(tmp_path)!r}]) == 2
"""
    assert {"fastapi", "uvicorn", "prometheus_client", "openai", "matplotlib"} <= set(not_in_core())
    result = run_without_extras(code)
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"spekula serve needs \w+, which the 'server' extra installs: pip install 'spekula\[server\]'", result.stderr
    ), result.stderr
    assert re.search(
        r"spekula bench needs \w+, which the 'bench' extra installs: pip install 'spekula\[bench\]'", result.stderr
    ), result.stderr


@pytest.mark.model
def test_generate_runs_without_any_extra():
    result = run_without_extras(
        "from spekula.cli import main\n"
        "sys.exit(main(['generate', 'def add(a, b):', '--target', 'smollm2-135m', '--draft', 'ngram', "
        "'--max-tokens', '8', '--json']))\n"
    )
    assert result.returncode == 0, result.stderr
    assert '"finish_reason"' in result.stdout.splitlines()[-1]
