"""What an operator can set about the server, validated once where it is made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from spekula.config import SamplingParams, is_int, is_number
from spekula.errors import ConfigError

API_KEY_ENV = "SPEKULA_API_KEY"


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"  # loopback unless the operator opens it up on purpose
    port: int = 8000
    api_key: str | None = None  # None: no authentication
    model_name: str | None = None  # the name clients send as `model`; None: the pipeline's target name
    max_running: int = 16  # requests stepped together (their KV caches live at once)
    max_queue: int = 64  # requests waiting for a running slot; beyond this: 429
    max_body_bytes: int = 1 << 20
    max_tokens_limit: int = 4096  # the largest max_tokens a request may ask for
    default_max_tokens: int = 256  # when the request gives none
    request_timeout_s: float = 600.0  # from arrival (queue wait included) to the last token
    shutdown_timeout_s: float = 30.0  # in-flight requests get this long to finish on shutdown
    prefill_chunk: int = 256  # prompt tokens prefilled per scheduler round, shared by the requests prefilling; 0: whole
    # the most of the worker's time that chunks leaving a prompt unfinished take while requests decode (Scheduler)
    prefill_share: float = 1 / 3
    log_prompts: bool = False  # prompts and outputs stay out of the logs unless asked for
    sampling: SamplingParams = field(default_factory=SamplingParams)  # defaults for fields a request omits

    def __post_init__(self) -> None:
        for name in (
            "port",
            "max_running",
            "max_queue",
            "max_body_bytes",
            "max_tokens_limit",
            "default_max_tokens",
        ):
            value = getattr(self, name)
            low = 0 if name in ("port", "max_queue") else 1
            if not is_int(value) or value < low:
                raise ConfigError(f"{_flag(name)} must be an integer >= {low}, got {value!r}")
        check_prefill(self.prefill_chunk, self.prefill_share, _flag)
        if self.port > 65535:
            raise ConfigError(f"--port must be at most 65535, got {self.port}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ConfigError(
                f"--default-max-tokens ({self.default_max_tokens}) exceeds --max-tokens-limit "
                f"({self.max_tokens_limit}); "
                "lower the first or raise the second"
            )
        for name in ("request_timeout_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if not is_number(value) or value <= 0:
                raise ConfigError(f"{_flag(name)} must be a number of seconds > 0, got {value!r}")
        if self.sampling.temperature > 2:  # what a request may ask for (OpenAI's range); the default must fit too
            raise ConfigError(f"--temperature must be in [0, 2] for the server, got {self.sampling.temperature}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError(f"the API key is empty; pass a non-empty --api-key (or {API_KEY_ENV}), or none at all")


def _flag(name: str) -> str:
    return "--" + name.removesuffix("_s").replace("_", "-")


def check_prefill(chunk: object, share: object, name: Callable[[str], str] = str) -> None:
    """The prefill options' one check, for ServerSettings (name: the flag, --prefill-chunk) and for a Scheduler
    made without them (the parameter's own name)."""
    if not is_int(chunk) or chunk < 0:
        raise ConfigError(f"{name('prefill_chunk')} must be an integer >= 0 (0: whole prompts), got {chunk!r}")
    if not is_number(share) or not 0 < share <= 1:
        raise ConfigError(f"{name('prefill_share')} must be a fraction in (0, 1], got {share!r}")
