"""scripts/gpu_bench.py in its CPU smoke mode (tiny random model), and its
hard-coded random-weight shapes against the catalogue models' configs where those are converted."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import pytest

from spekula.backends.native_loader import args_from_hf_config
from spekula.models.cache import hf_root

from scriptkit import SCRIPTS, loaded

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def bench():
    with loaded("gpu_bench.py") as module:
        yield module


def test_cpu_smoke_mode_prints_one_json_line(bench, capsys):
    argv = ["--device", "cpu", "--dtype", "float32", "--tiny", "--prompts", "2", "--new-tokens", "12", "--repeats", "1"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1  # the card goes to stderr
    result = json.loads(lines[0])
    for field in (
        "gpu",
        "torch",
        "dtype",
        "target",
        "draft",
        "k",
        "prompts",
        "new_tokens",
        "plain_tok_s",
        "spec_tok_s",
        "speedup",
        "alpha",
        "tau",
        "greedy_equal",
        "weights",
    ):
        assert field in result, field
    assert result["greedy_equal"] is True and result["identical"] == "2/2" and result["divergences"] == []
    assert (result["weights"], result["draft"], result["target"]) == ("random", "self (random weights)", "tiny")
    assert (result["device"], result["gpu"]) == ("cpu", None)
    assert result["prompts"] == 2 and result["new_tokens"] == 12 and result["k"] == 4
    assert result["alpha"] >= 0.9  # the target drafting for itself
    assert result["plain_tok_s"] > 0 and result["spec_tok_s"] > 0 and result["speedup"] > 0


def test_wrapper_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPTS / "gpu_bench.sh")], check=True)


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_random_shapes_are_the_catalogue_models(bench, name):
    config = hf_root() / name / "config.json"
    if not config.is_file():
        pytest.skip(f"{name} is not converted in this cache")
    loaded = args_from_hf_config(json.loads(config.read_text()))
    assert loaded.norm_eps == pytest.approx(1e-6)
    assert replace(bench.RANDOM_SHAPES[name], norm_eps=loaded.norm_eps) == loaded
