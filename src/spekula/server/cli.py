"""`spekula serve`: load the models, then serve the OpenAI-compatible API with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from typing import Any

from spekula.config import MAX_PARALLEL, BackendConfig
from spekula.extras import needs_extra
from spekula.knobs import add_knob_flags, knob_values
from spekula.options import (
    add_model_options,
    add_sampling_options,
    add_suffix_options,
    backend_from_args,
    draft_backend_from_args,
    sampling_from_args,
    spec_from_args,
)
from spekula.server.listen import bind

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(sub: Any) -> dict[str, argparse.ArgumentParser]:
    from spekula.server.settings import ServerSettings

    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API (completions, chat, models, metrics)")
    add_model_options(p)
    add_suffix_options(p)
    add_sampling_options(p)
    g = p.add_argument_group("server")
    add_knob_flags(g, ServerSettings)  # each flag from its one declaration (spekula.server.settings)
    g.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=cmd_serve)
    return {"serve": p}


def settings_from_args(args: argparse.Namespace):
    from spekula.server.settings import API_KEY_ENV, ServerSettings

    values = knob_values(ServerSettings, args)
    values["api_key"] = values["api_key"] or os.environ.get(API_KEY_ENV) or None  # the flag wins over the environment
    return ServerSettings(**values, sampling=sampling_from_args(args))


def target_backend(args: argparse.Namespace, settings) -> BackendConfig:
    """The target's BackendConfig: one sequence per running request plus one for a kept prompt cache (more
    are kept while running requests leave ids spare: PromptCache), batched in one pass where the runtime
    can (llama.cpp: one shared context; BackendConfig.parallel)."""
    return replace(backend_from_args(args), parallel=min(settings.max_running + 1, MAX_PARALLEL))


def cmd_serve(args: argparse.Namespace) -> int:
    with needs_extra("server", "spekula serve"):
        from spekula.server.app import create_app
        from spekula.server.shutdown import serve
    from spekula.pipeline import Pipeline
    from spekula.threads import on_passing_thread

    settings = settings_from_args(args)  # bad options fail before minutes of model loading
    sock = bind(settings.host, settings.port)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.host not in LOOPBACK and settings.api_key is None:
        _say(f"warning: listening on {settings.host} without an API key: anyone who can reach this port can use it")
    _say(f"loading target {args.target} and draft {args.draft} ({args.dtype}) ...")
    # on a thread that ends: the scheduler thread is then the only one computing (spekula.threads)
    pipe = on_passing_thread(
        Pipeline.load,
        args.target,
        args.draft,
        spec_from_args(args),
        target_backend(args, settings),
        draft_backend_from_args(args),
    )
    host, port = sock.getsockname()[:2]
    _say(
        f"serving {settings.model_name or pipe.target.name} on http://{host}:{port}/v1 "
        "(Ctrl-C stops: running requests finish first)"
    )
    return serve(create_app(pipe, settings), sock, args.log_level)  # drains on SIGTERM/SIGINT, then exits 0


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
