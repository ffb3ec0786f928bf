"""`spekula serve` options -> ServerSettings; bad options fail before any model loads."""

from __future__ import annotations

import re

import pytest

from spekula.cli import build_parser, main
from spekula.errors import ConfigError
from spekula.server.cli import settings_from_args, target_backend
from spekula.server.listen import bind
from spekula.server.settings import ServerSettings


def settings(*argv: str) -> ServerSettings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_are_safe(monkeypatch):
    monkeypatch.delenv("SPEKULA_API_KEY", raising=False)
    s = settings()
    assert (s.host, s.port, s.api_key, s.log_prompts) == ("127.0.0.1", 8000, None, False)


def test_options_and_environment(monkeypatch):
    monkeypatch.setenv("SPEKULA_API_KEY", "from-env")
    s = settings(
        "--port",
        "9000",
        "--max-queue",
        "3",
        "--max-running",
        "2",
        "--max-tokens-limit",
        "50",
        "--default-max-tokens",
        "10",
        "--request-timeout",
        "5",
        "--temperature",
        "0.7",
        "--log-prompts",
    )
    assert (s.port, s.max_queue, s.max_running, s.max_tokens_limit, s.default_max_tokens) == (9000, 3, 2, 50, 10)
    assert (s.api_key, s.request_timeout_s, s.sampling.temperature, s.log_prompts) == ("from-env", 5.0, 0.7, True)
    assert settings("--api-key", "flag").api_key == "flag"  # the flag wins over the environment


@pytest.mark.parametrize("running,parallel", [(16, 17), (1, 2), (400, 256)])
def test_the_target_holds_a_sequence_per_running_request_and_the_prompt_cache(running, parallel):
    """llama.cpp batches the running requests in one shared context of --max-running + 1 sequences
    (the prompt cache keeps one), at most llama.cpp's 256."""
    args = build_parser().parse_args(["serve", "--backend", "llamacpp", "--max-running", str(running)])
    config = target_backend(args, settings_from_args(args))
    assert (config.runtime, config.parallel) == ("llamacpp", parallel)


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--max-running", "0"], "--max-running must be an integer >= 1"),
        (["--max-queue", "-1"], "--max-queue must be an integer >= 0"),
        (["--port", "70000"], "--port must be an integer >= 0 and <= 65535"),
        (["--default-max-tokens", "500", "--max-tokens-limit", "100"], "exceeds --max-tokens-limit"),
        (["--request-timeout", "0"], "--request-timeout must be a number of seconds > 0"),
        (["--temperature", "3"], "--temperature must be in [0, 2]"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
    ],
)
def test_bad_options_say_what_to_change(argv, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        settings(*argv)


def test_a_taken_port_is_a_clear_error(capsys):
    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)
        assert main(["serve", "--port", str(port), "--target", "no-such-model"]) == 2  # fails before loading anything
        assert "choose another --port" in capsys.readouterr().err
    finally:
        taken.close()
