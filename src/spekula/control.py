"""How many tokens to draft: the controller.

FixedK drafts the same k every step. (The cost-model controller of `--k auto` lives here too once
it exists: it will see the same observe() calls.)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class Controller(ABC):
    """One per request: chooses k before each step and learns from the outcome."""

    @abstractmethod
    def choose_k(self) -> int: ...

    def observe(self, k: int, num_drafted: int, num_accepted: int, draft_s: float, score_s: float) -> None:
        """Outcome of one step: what was drafted and accepted, and what the draft and the verify pass cost."""


@dataclass
class FixedK(Controller):
    k: int

    def choose_k(self) -> int:
        return self.k
