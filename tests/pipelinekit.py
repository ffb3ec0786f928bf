"""In-memory pipelines with known logits and a byte-level tokenizer: the pipeline and server tests without weights.

The fake model reads and writes bytes (id = byte value, 256 = end of sequence) and its logits come
from a random table over printable ASCII, so every output is deterministic text. `delay_s` makes
each forward pass take that long (simulated compute, so a stream lasts long enough to walk away
from); `valve` (a threading.Event) holds every forward pass until it is set.

A top-level module of tests/ (importable from every test folder, as tests/conftest.py's folder is on
sys.path); it imports nothing from spekula.server.
"""

from __future__ import annotations

import functools
import threading
import time

import torch

from spekula.config import SpecConfig
from spekula.pipeline import Pipeline
from spekula.proposers import DraftModelFactory, NgramFactory
from spekula.testing import FunctionBackend, FunctionSequence
from spekula.text import TextCodec

EOS = 256
VOCAB = 257
MODEL = "fake-bytes"


class ByteTokenizer:
    chat_template = "<role>content\\n ... <assistant>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>")

    def get_vocab(self) -> dict[str, int]:
        return {**{f"<0x{i:02X}>": i for i in range(256)}, "</s>": EOS}


class SlowBackend(FunctionBackend):
    def __init__(
        self, logits_fn, vocab_size, *, delay_s: float = 0.0, valve: threading.Event | None = None, **kw
    ) -> None:
        super().__init__(logits_fn, vocab_size, **kw)
        self.delay_s = delay_s
        self.valve = valve

    def new_sequence(self) -> FunctionSequence:
        backend = self

        class Sequence(FunctionSequence):
            def _forward(self, token_ids, num_logits):
                if backend.valve is not None:
                    backend.valve.wait()
                if backend.delay_s:
                    time.sleep(backend.delay_s)  # simulated compute, not synchronisation
                return super()._forward(token_ids, num_logits)

        return Sequence(self)


@functools.lru_cache(maxsize=4)  # 68 MB each: built once per seed, shared (read-only) by every test
def printable_table(seed: int, eos_bias: float = -4.0):
    """Logits indexed by the last two tokens; only printable ASCII (and, rarely, EOS) can win."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(VOCAB * VOCAB, VOCAB, generator=g) * 3.0
    allowed = torch.full((VOCAB,), -1e4)
    allowed[32:127] = 0.0
    allowed[EOS] = eos_bias
    table += allowed

    def logits_fn(prefix: list[int]) -> torch.Tensor:
        a, b = (prefix[-2] if len(prefix) > 1 else 0), prefix[-1]
        return table[a * VOCAB + b]

    return logits_fn


def fake_pipeline(
    draft: str = "same",
    k: int | None = 4,
    delay_s: float = 0.0,
    valve: threading.Event | None = None,
    context_length: int = 512,
    draft_delay_s: float = 0.0,
) -> Pipeline:
    """draft: 'same' (a copy of the target: alpha = 1 when greedy), 'other' (a different table), 'ngram', 'none'.
    delay_s / draft_delay_s: simulated seconds per forward pass of the target / the draft model."""
    target = SlowBackend(
        printable_table(0), VOCAB, eos=EOS, context_length=context_length, name=MODEL, delay_s=delay_s, valve=valve
    )
    spec = SpecConfig(k=k)

    def table_draft(seed: int, name: str) -> DraftModelFactory:
        return DraftModelFactory(
            SlowBackend(
                printable_table(seed), VOCAB, eos=EOS, context_length=context_length, name=name, delay_s=draft_delay_s
            )
        )

    proposer = {
        "same": lambda: table_draft(0, "draft-same"),
        "other": lambda: table_draft(7, "draft-other"),
        "ngram": lambda: NgramFactory(4, 1),
        "none": lambda: None,
    }[draft]()
    return Pipeline(target, TextCodec(ByteTokenizer()), proposer, spec, draft_name=draft)


def native_pipeline(k: int | None, draft: str = "self") -> Pipeline:
    """A tiny random-weight model in the native runner, which batches: the scheduler runs continuous
    batching with it. draft: 'self' (the same weights: alpha = 1 when greedy) or 'other' (other weights)."""
    from spekula.backends.native import ModelArgs, NativeBackend, Transformer
    from spekula.proposers.draft_model import DraftModelFactory

    args = ModelArgs(
        vocab_size=VOCAB,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        hidden_dim=128,
        norm_eps=1e-6,
        max_seq_len=512,
    )
    torch.manual_seed(0)
    target_model = Transformer(args).eval()
    target = NativeBackend(target_model, name=MODEL, eos_token_ids=[EOS])
    draft_model = target_model if draft == "self" else Transformer(args).eval()
    proposer = DraftModelFactory(NativeBackend(draft_model, name=f"draft-{draft}"))
    return Pipeline(target, TextCodec(ByteTokenizer()), proposer, SpecConfig(k=k), draft_name=draft)


__all__ = [
    "native_pipeline",
    "ByteTokenizer",
    "SlowBackend",
    "fake_pipeline",
    "printable_table",
    "MODEL",
    "EOS",
    "VOCAB",
]
