"""Who drafts. This module is the one registry: the only place a proposer's name is a string."""

from __future__ import annotations

from collections.abc import Callable

from spekula.backends.base import Backend
from spekula.config import SpecConfig, SuffixOptions
from spekula.draft_class import NO_DRAFT
from spekula.errors import ConfigError
from spekula.proposers.base import EMPTY_DRAFT, Draft, Proposer, ProposerFactory
from spekula.proposers.draft_model import DraftModelFactory, DraftModelProposer
from spekula.proposers.ngram import NgramFactory, NgramProposer
from spekula.proposers.suffix import SuffixConfig, SuffixFactory, SuffixProposer

NONE = "none"
NGRAM = "ngram"
SUFFIX = "suffix"

# name -> builder(spec, target) for proposers that need no model. Everything else given as --draft is a model.
MODEL_FREE: dict[str, Callable[[SpecConfig, Backend], ProposerFactory]] = {
    NGRAM: lambda spec, target: NgramFactory(spec.ngram_max, spec.ngram_min),
    SUFFIX: lambda spec, target: SuffixFactory(suffix_config(spec), vocab_size=target.vocab_size),
}


def suffix_config(spec: SpecConfig) -> SuffixConfig:
    """The user's suffix knobs, drafting as far as the engine may verify: a fixed k, or --k auto's k_max (a
    draft is cut to the step's k anyway; a cap of its own below k_max would make `--k-max 48` draft at most 16)."""
    return SuffixConfig.from_options(spec.suffix, max_draft=max(spec.k or 0, spec.k_max))


def needs_model(draft: str | None) -> bool:
    """True when `draft` names a draft model (catalogue name or path) rather than a proposer kind."""
    return draft not in (None, NONE) and draft not in MODEL_FREE


def build_proposer(
    draft: str | None,
    spec: SpecConfig,
    *,
    target: Backend,
    load_draft: Callable[[str], Backend] | None = None,
) -> ProposerFactory | None:
    """`draft` as a user writes it: 'none', 'ngram', 'suffix', or a model name / path (loaded by load_draft)."""
    if draft in (None, NONE):
        return None
    if draft != SUFFIX and spec.suffix != SuffixOptions():
        raise ConfigError(
            f"the suffix options (--suffix-*) set how 'suffix' drafts; {draft!r} does not use them. Drop them, "
            "or choose --draft suffix"
        )
    if draft in MODEL_FREE:
        if spec.draft_confidence is not None:
            raise ConfigError(
                f"draft_confidence stops a draft model's draft; {draft!r} has no probabilities to stop on. "
                "Drop --draft-confidence (confidence= in a --spec), or choose a draft model"
            )
        return MODEL_FREE[draft](spec, target)
    if load_draft is None:
        raise ConfigError(
            f"unknown proposer {draft!r}; choose 'none', {', '.join(repr(n) for n in MODEL_FREE)} or a model"
        )
    backend = load_draft(draft)
    check_same_vocabulary(target, backend)
    return DraftModelFactory(backend, confidence=spec.draft_confidence)


def check_same_vocabulary(target: Backend, draft: Backend) -> None:
    """The verifier compares token ids: a draft of another vocabulary would be rejected at random."""
    if target.vocab_size != draft.vocab_size:
        raise ConfigError(
            f"draft {draft.name!r} has a vocabulary of {draft.vocab_size} tokens but target {target.name!r} has "
            f"{target.vocab_size}; speculative decoding needs the same token ids. Choose a draft of the same "
            f"family (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b) or --draft ngram"
        )


__all__ = [
    "Draft",
    "EMPTY_DRAFT",
    "NO_DRAFT",
    "Proposer",
    "ProposerFactory",
    "DraftModelFactory",
    "DraftModelProposer",
    "NgramFactory",
    "NgramProposer",
    "build_proposer",
    "check_same_vocabulary",
    "needs_model",
    "NONE",
    "NGRAM",
    "SuffixConfig",
    "SuffixFactory",
    "SuffixProposer",
    "SUFFIX",
]
