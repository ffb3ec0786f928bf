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
    from spekula.server.settings import API_KEY_ENV, ServerSettings

    d = ServerSettings()
    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API (completions, chat, models, metrics)")
    add_model_options(p)
    add_suffix_options(p)
    add_sampling_options(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}: this machine only)")
    g.add_argument("--port", type=int, default=d.port, help=f"(default {d.port}; 0 = any free port)")
    g.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: ${API_KEY_ENV}, else none)",
    )
    g.add_argument(
        "--served-model-name", default=None, help="the name clients send as `model` (default: the --target name)"
    )
    g.add_argument(
        "--max-running",
        type=int,
        default=d.max_running,
        help=f"requests generating at once, batched in one pass (default {d.max_running}); on llama.cpp the KV cache "
        "for this many requests (plus one kept by the prompt cache) of --context-length tokens each is allocated "
        "at start",
    )
    g.add_argument(
        "--max-queue",
        type=int,
        default=d.max_queue,
        help=f"requests waiting for a slot; beyond this: 429 (default {d.max_queue})",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help=f"largest request body; beyond this: 413 (default {d.max_body_bytes})",
    )
    g.add_argument(
        "--max-tokens-limit",
        type=int,
        default=d.max_tokens_limit,
        help=f"largest max_tokens a request may ask for (default {d.max_tokens_limit})",
    )
    g.add_argument(
        "--default-max-tokens",
        type=int,
        default=d.default_max_tokens,
        help=f"max_tokens when a request gives none (default {d.default_max_tokens})",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout_s,
        help=f"seconds from arrival to the last token; then 504 (default {d.request_timeout_s:g})",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=d.shutdown_timeout_s,
        help=f"on SIGTERM/Ctrl-C, seconds running requests get to finish, then 503 (default {d.shutdown_timeout_s:g})",
    )
    g.add_argument(
        "--prefill-chunk",
        type=int,
        default=d.prefill_chunk,
        help="prompt tokens prefilled per scheduler round, so running requests keep decoding while a long prompt "
        f"prefills (shared by the requests prefilling; 0 = each prompt whole; default {d.prefill_chunk})",
    )
    g.add_argument(
        "--prefill-share",
        type=float,
        default=d.prefill_share,
        help="while requests decode, the most of the worker's time that chunks of a longer prompt may take: the rest "
        "goes to the requests decoding, which are nearer their end (1 = a chunk every round; "
        f"default {d.prefill_share:.3g})",
    )
    g.add_argument("--log-prompts", action="store_true", help="write prompts and outputs to the log (off by default)")
    g.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=cmd_serve)
    return {"serve": p}


def settings_from_args(args: argparse.Namespace):
    from spekula.server.settings import API_KEY_ENV, ServerSettings

    return ServerSettings(
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        model_name=args.served_model_name,
        max_running=args.max_running,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        max_tokens_limit=args.max_tokens_limit,
        default_max_tokens=args.default_max_tokens,
        request_timeout_s=args.request_timeout,
        shutdown_timeout_s=args.shutdown_timeout,
        prefill_chunk=args.prefill_chunk,
        prefill_share=args.prefill_share,
        log_prompts=args.log_prompts,
        sampling=sampling_from_args(args),
    )


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
