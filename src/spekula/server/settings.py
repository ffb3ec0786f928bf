"""What an operator can set about the server, each option declared once (spekula.knobs): its flag, default,
help and bounds; `spekula serve`'s flags are made from these declarations and every value is checked against
them where ServerSettings is made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from spekula.config import SamplingParams
from spekula.errors import ConfigError
from spekula.knobs import check_knobs, knob, knob_of

API_KEY_ENV = "SPEKULA_API_KEY"


@dataclass(frozen=True)
class ServerSettings:
    host: str = knob("127.0.0.1", "--host", "address to bind (default {default}: this machine only)")
    port: int = knob(8000, "--port", "(default {default}; 0 = any free port)", low=0, high=65535)
    api_key: str | None = knob(  # None: no authentication
        None,
        "--api-key",
        f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: ${API_KEY_ENV}, else none)",
        kind=str,
    )
    model_name: str | None = knob(  # None: the pipeline's target name
        None, "--served-model-name", "the name clients send as `model` (default: the --target name)", kind=str
    )
    max_running: int = knob(
        16,
        "--max-running",
        "requests generating at once, batched in one pass (default {default}); on llama.cpp the KV cache for this "
        "many requests (plus one kept by the prompt cache) of --context-length tokens each is allocated at start",
        low=1,
    )
    max_queue: int = knob(64, "--max-queue", "requests waiting for a slot; beyond this: 429 (default {default})", low=0)
    max_body_bytes: int = knob(
        1 << 20, "--max-body-bytes", "largest request body; beyond this: 413 (default {default})", low=1
    )
    max_tokens_limit: int = knob(
        4096, "--max-tokens-limit", "largest max_tokens a request may ask for (default {default})", low=1
    )
    default_max_tokens: int = knob(
        256, "--default-max-tokens", "max_tokens when a request gives none (default {default})", low=1
    )
    request_timeout_s: float = knob(
        600.0,
        "--request-timeout",
        "seconds from arrival (queue wait included) to the last token; then 504 (default {default})",
        low=0,
        low_open=True,
        noun="a number of seconds",
    )
    shutdown_timeout_s: float = knob(
        30.0,
        "--shutdown-timeout",
        "on SIGTERM/Ctrl-C, seconds running requests get to finish, then 503 (default {default})",
        low=0,
        low_open=True,
        noun="a number of seconds",
    )
    prefill_chunk: int = knob(
        256,
        "--prefill-chunk",
        "prompt tokens prefilled per scheduler round, so running requests keep decoding while a long prompt "
        "prefills (shared by the requests prefilling; 0 = each prompt whole; default {default})",
        low=0,
    )
    prefill_share: float = knob(
        1 / 3,
        "--prefill-share",
        "while requests decode, the most of the worker's time that chunks of a longer prompt may take: the rest "
        "goes to the requests decoding, which are nearer their end (1 = a chunk every round; default {default})",
        low=0,
        low_open=True,
        high=1,
        noun="a fraction",
    )
    spec_disable_by_batch_size: int | None = knob(
        None,
        "--spec-disable-by-batch-size",
        "draft nothing in a round with more than this many requests decoding (named after vLLM's option, which "
        "counts queued requests): a round's draft rows lengthen it for every request in it, so a request that "
        "cannot copy slows while one that copies speeds up (default: no limit, the round's ks chosen for the most "
        "tokens a second)",
        kind=int,
        low=1,
    )
    spec_max_slowdown: float = knob(
        0.02,
        "--spec-max-slowdown",
        "the most a round's drafts may slow any request decoding beside them, expected: a draft joins a round "
        "only if every request in it keeps at least (1 - this) of the tokens a second a round drafting nothing "
        "gives it, so one request's copying no longer makes another that cannot copy wait for its rows (1 = no "
        "bound: the round's ks chosen for the most tokens a second over all requests; default {default})",
        low=0,
        high=1,
        noun="a fraction",
    )
    log_prompts: bool = knob(False, "--log-prompts", "write prompts and outputs to the log (off by default)")
    sampling: SamplingParams = field(default_factory=SamplingParams)  # defaults for fields a request omits

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.default_max_tokens > self.max_tokens_limit:
            raise ConfigError(
                f"--default-max-tokens ({self.default_max_tokens}) exceeds --max-tokens-limit "
                f"({self.max_tokens_limit}); "
                "lower the first or raise the second"
            )
        if self.sampling.temperature > 2:  # what a request may ask for (OpenAI's range); the default must fit too
            raise ConfigError(f"--temperature must be in [0, 2] for the server, got {self.sampling.temperature}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError(f"the API key is empty; pass a non-empty --api-key (or {API_KEY_ENV}), or none at all")


def check_prefill(chunk: object, share: object, name: Callable[[str], str] = str) -> None:
    """The prefill options' checks as ServerSettings declares them, for a Scheduler made without settings (name:
    what a message calls each option; by default its parameter's own name)."""
    for option, value in (("prefill_chunk", chunk), ("prefill_share", share)):
        check_option(option, value, name)


def check_option(option: str, value: object, name: Callable[[str], str] = str) -> None:
    """One option's check as ServerSettings declares it, its message calling it name(option)."""
    replace(knob_of(ServerSettings, option), flag=name(option)).check(value)


if __name__ == "__main__":  # docs/SERVER.md's table of these options, from their declarations
    import sys

    from spekula.knobs import write_tables

    docs = sys.argv[1] if len(sys.argv) > 1 else "docs/SERVER.md"
    changed = write_tables(Path(docs), {"ServerSettings": ServerSettings})
    print(f"{docs}: {'table rewritten' if changed else 'table already current'}")
