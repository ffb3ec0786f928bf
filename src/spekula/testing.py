"""In-memory models with known logits, for tests and examples that must not load weights."""

from __future__ import annotations

from collections.abc import Callable

import torch

from spekula.backends.base import Backend, Sequence, pass_kind

LogitsFn = Callable[[list[int]], torch.Tensor]  # prefix (ending with the current token) -> [V]


class FunctionBackend(Backend):
    """A 'model' whose next-token logits are any function of the prefix."""

    def __init__(
        self,
        logits_fn: LogitsFn,
        vocab_size: int,
        *,
        eos: int | None = None,
        context_length: int = 4096,
        name: str = "function",
    ) -> None:
        self.logits_fn = logits_fn
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.eos_token_ids = frozenset() if eos is None else frozenset({eos})
        self.name = name
        self.passes = 0  # forward calls, for tests that count target passes
        self.tokens_fed = 0  # tokens run through the model, for tests that check cache reuse

    def new_sequence(self) -> FunctionSequence:
        return FunctionSequence(self)


class FunctionSequence(Sequence):
    def __init__(self, backend: FunctionBackend) -> None:
        super().__init__(backend.context_length)
        self.backend = backend

    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        self.backend.passes += 1
        self.backend.tokens_fed += len(token_ids)
        prefix = list(self.tokens)
        rows = []
        for t in token_ids:
            prefix.append(t)
            rows.append(self.backend.logits_fn(prefix))
        return torch.stack(rows[len(rows) - num_logits :]).float()

    def _truncate(self, length: int) -> None:
        pass


class KindedSequence(FunctionSequence):
    """A FunctionSequence that records each row's pass kind (Capabilities.pass_kind_widths of its backend) as
    llama.cpp's exact mode does (LlamaCppSequence.pass_kinds): one pass per forward."""

    def __init__(self, backend: FunctionBackend) -> None:
        super().__init__(backend)
        self.kinds = bytearray()

    @property
    def pass_kinds(self) -> bytearray:
        return self.kinds

    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        self.kinds.extend([pass_kind(len(token_ids), self.backend.capabilities.pass_kind_widths)] * len(token_ids))
        return super()._forward(token_ids, num_logits)

    def _truncate(self, length: int) -> None:
        del self.kinds[length:]


def random_table_backend(
    vocab_size: int, seed: int, *, order: int = 1, eos: int | None = None, scale: float = 3.0, name: str = "table"
) -> FunctionBackend:
    """Logits from a random table indexed by the last `order` tokens (a random n-gram 'model')."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab_size**order, vocab_size, generator=g) * scale

    def logits_fn(prefix: list[int]) -> torch.Tensor:
        index = 0
        for t in prefix[-order:]:
            index = index * vocab_size + t
        return table[index % table.shape[0]]

    return FunctionBackend(logits_fn, vocab_size, eos=eos, name=name)
