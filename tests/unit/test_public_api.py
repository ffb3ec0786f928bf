"""The package root is the library's front door: `from spekula import Pipeline, StopConfig` works,
the README's example runs as written (here on an in-memory model), and `import spekula` alone stays
light (the pipeline, and torch with it, load on first use)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import spekula
from spekula import Pipeline, SamplingParams, SpecConfig, StopConfig
from spekula.proposers import DraftModelFactory
from spekula.testing import FunctionBackend
from spekula.text import TextCodec

VOCAB = 128  # ASCII: token id = byte value


class AsciiTokenizer:
    """The tokenizer surface TextCodec uses, one token per ASCII byte."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("ascii"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("ascii")

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(VOCAB)}


def printable_model(seed: int) -> FunctionBackend:
    """Next-token logits from a random table indexed by the last token; only printable ASCII can win."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(VOCAB, VOCAB, generator=g) * 3.0
    table[:, :32] = -1e4
    table[:, 127] = -1e4

    return FunctionBackend(lambda prefix: table[prefix[-1]], VOCAB, name=f"printable-{seed}")


def readme_pipeline() -> Pipeline:
    """What Pipeline.load builds, with in-memory models: the draft is a copy of the target, so a
    greedy draft is always accepted."""
    draft = DraftModelFactory(printable_model(0))
    return Pipeline(printable_model(0), TextCodec(AsciiTokenizer()), draft, SpecConfig(k=4))


def test_the_readme_names_are_the_library_classes():
    from spekula.config import SamplingParams as config_sampling
    from spekula.config import SpecConfig as config_spec
    from spekula.config import StopConfig as config_stop
    from spekula.pipeline import Pipeline as pipeline_class

    assert Pipeline is pipeline_class
    assert (SamplingParams, SpecConfig, StopConfig) == (config_sampling, config_spec, config_stop)
    for name in spekula.__all__:
        assert getattr(spekula, name) is not None, name
    assert "Pipeline" in dir(spekula)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        spekula.NoSuchThing  # noqa: B018
    assert not hasattr(spekula, "NoSuchThing")


def test_the_readme_example_streams_text_and_reports_alpha_and_tau():
    pipe = readme_pipeline()
    ids = pipe.codec.encode("def quicksort(arr):")
    run = pipe.start(ids, stop=StopConfig(max_tokens=24))
    streamed = "".join(run)
    done = run.result()

    assert streamed and done.text == streamed
    assert len(done.token_ids) == 24 and done.finish_reason == "length"
    assert done.stats.alpha == 1.0  # the draft is the target: every drafted token is accepted
    assert done.stats.tau > 1.0  # so each target pass emits more than one token
    plain = pipe.generate(ids, SamplingParams(temperature=0), StopConfig(max_tokens=24), plain=True)
    assert done.token_ids == plain.token_ids  # greedy speculative output == greedy plain output


def test_importing_spekula_does_not_load_the_pipeline():
    code = (
        "import sys, spekula\n"
        "assert 'spekula.pipeline' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
        "spekula.Pipeline\n"
        "assert 'spekula.pipeline' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
