"""--exact: from the command line (or a --config file) to BackendConfig, and only to the target."""

import argparse

import pytest

from spekula.config import BackendConfig
from spekula.errors import ConfigError
from spekula.options import add_model_options, backend_from_args, draft_backend_from_args


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_model_options(p)
    return p.parse_args(list(argv))


def test_exact_is_the_default_and_reaches_the_target_config():
    assert BackendConfig().exact is True
    assert backend_from_args(parse("--backend", "llamacpp")).exact is True
    assert backend_from_args(parse("--backend", "llamacpp", "--no-exact")).exact is False
    assert backend_from_args(parse("--backend", "llamacpp", "--no-exact", "--exact")).exact is True


def test_the_draft_is_never_made_exact():
    """Only the target's logits decide the output; an exact draft would only be slower."""
    args = parse("--backend", "llamacpp", "--exact", "--draft", "qwen2.5-coder-0.5b")
    assert draft_backend_from_args(args).exact is False


def test_exact_must_be_a_bool():
    with pytest.raises(ConfigError, match="exact"):
        BackendConfig(exact="yes")
