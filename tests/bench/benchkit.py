"""In-memory models, a byte-level tokenizer and a workload nobody wrote the code for: bench / tune /
audit in CI without weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from spekula.bench.runner import SpecChoice, build_contenders
from spekula.testing import FunctionBackend, FunctionSequence, random_table_backend

VOCAB = 128  # ASCII: every output decodes to text


class ByteCodec:
    """ASCII bytes as token ids; chat messages become '<role>content' lines. Enough for the text layer."""

    def encode(self, prompt=None, messages=None, chat=False):
        if messages is None:
            messages = [{"role": "user", "content": prompt}] if chat else None
        text = (
            prompt if messages is None else "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
        )
        return [b if b < VOCAB else ord("?") for b in text.encode("utf-8")]

    def decode(self, ids):
        return bytes(i for i in ids if i < VOCAB).decode("ascii", errors="replace")

    def vocabulary_fingerprint(self):
        return "ascii-bytes"


def burn(work: int) -> None:
    """Real arithmetic (no sleeping): `work` products of a 64 x 64 matrix."""
    x = _W
    for _ in range(work):
        x = torch.tanh(x @ _W)


_W = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) / 8


class CostlySequence(FunctionSequence):
    def _forward(self, token_ids, num_logits):
        burn(self.backend.work)
        return super()._forward(token_ids, num_logits)


class CostlyBackend(FunctionBackend):
    """A FunctionBackend whose every forward pass also does `work` matrix products, however many
    tokens it gets: the cost shape of a memory-bound language-model pass (k + 1 tokens cost ~ 1)."""

    def __init__(self, logits_fn, vocab_size, work: int, name: str) -> None:
        super().__init__(logits_fn, vocab_size, name=name)
        self.work = work

    def new_sequence(self):
        return CostlySequence(self)


def table(seed: int, work: int = 0, name: str | None = None) -> FunctionBackend:
    inner = random_table_backend(VOCAB, seed=seed, order=2)
    if not work:
        inner.name = name or f"table-{seed}"
        return inner
    return CostlyBackend(inner.logits_fn, VOCAB, work, name or f"table-{seed}-work{work}")


def contenders_for(target, drafts: dict[str, FunctionBackend], choices: list[SpecChoice]):
    """Contenders over `target`; a choice's draft name is looked up in `drafts` (or is 'ngram')."""
    return build_contenders(target, ByteCodec(), choices, load_draft=lambda name: drafts[name])


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# A workload file nobody wrote the code for: plain prompts, chat messages, a per-line max_tokens.
UNSEEN = [
    {"prompt": "def add(a, b):\n    return a + b\n\ndef add(a, b):", "category": "repeat"},
    {"prompt": "the cat sat on the mat. the cat sat on", "category": "repeat", "max_tokens": 12},
    {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        "category": "chat",
    },
    {"messages": [{"role": "user", "content": "list three colours"}], "category": "chat", "id": "colours"},
]


def tune_over(contenders, choices, workload, tmp_path, **options):
    """spekula.bench.commands.tune over in-memory contenders with the settings the tune tests share; options
    override them (dtype, runtime, emit, ...)."""
    from spekula.bench import commands
    from spekula.bench.workloads import load_workload

    settings = dict(
        target_name="table-0",
        dtype="float32",
        models=[],
        workload_name="w",
        out_dir=tmp_path / "out",
        config_path=tmp_path / "tuned.json",
        max_tokens=16,
        progress=False,
    )
    return commands.tune(contenders, choices, ByteCodec(), load_workload(workload), **{**settings, **options})
