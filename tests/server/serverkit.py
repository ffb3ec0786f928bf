"""Test kit for the server: the in-memory pipelines of tests/pipelinekit.py, and a uvicorn server on loopback."""

from __future__ import annotations

from spekula.server.background import Running, serving  # re-exported for the tests

from pipelinekit import EOS, MODEL, VOCAB, ByteTokenizer, SlowBackend, fake_pipeline, native_pipeline, printable_table

__all__ = [
    "native_pipeline",
    "ByteTokenizer",
    "SlowBackend",
    "fake_pipeline",
    "printable_table",
    "serving",
    "Running",
    "MODEL",
    "EOS",
    "VOCAB",
]


def break_target(pipe) -> None:
    """The target's passes raise once they see "~" (a kernel failure on that request's tokens only)."""
    healthy = pipe.target.logits_fn

    def logits_fn(prefix):
        if ord("~") in prefix:
            raise RuntimeError("simulated kernel failure")
        return healthy(prefix)

    pipe.target.logits_fn = logits_fn
