"""Shadow drafts: what a free proposer would have drafted at a plain step, checked against what the target emits.

A controller learns a draft class's acceptance only from drafts it verifies, and it verifies only where it
already expects them to pay. So a class whose prior is pessimistic is never tried and never learnt: on
llama.cpp, where a wide pass is dear, a fresh process can decode a code edit that re-emits its prompt almost
entirely plainly with a suffix match in hand (`spekula generate --chat --draft suffix --trace` on the
code-editing-01 prompt shows it step by step; docs/decisions/0005-shadow-drafts-off.md).

A model-free proposer (suffix or n-gram lookup: Proposer.free_to_draft) drafts in microseconds, so at a
plain step the engine asks it for the draft it would have made anyway and keeps it aside. The tokens the
target emits next (by any kind of step) are the target's own continuation of the same context, so they
score that draft exactly as verification would have: a drafted token is accepted exactly when it equals the
emitted one, under greedy decoding and under sampling alike (a sampled position's token is the target's own
seeded draw there, whatever the step: spekula.verify.verify_positional). Once the draft is settled (a token
differs, or all of them matched), the controller learns it as it learns a verified draft
(Controller.observe_shadow): nothing is verified, so the pass costs and output are untouched. One shadow is
open at a time, so overlapping drafts of one stretch do not count the same tokens twice.

Where (engine.Generation._open_shadow): only with SpecConfig.shadow_drafts (off by default), only after a
match of SHADOW_MIN_MATCH tokens or more, and only while the request has verified no draft of its own
(Controller.wants_shadows): the cold start. Off by default: in same-run A/Bs against the default they
raised copy-heavy categories but lowered the median prompt's speedup, so they stay opt-in until a longer run
settles it (docs/decisions/0005-shadow-drafts-off.md has the command, the runs and the machine).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from spekula.draft_class import DraftClass

# Shadows are drafted only after a match of at least this many tokens. Copying shows itself in long
# matches; one- to three-token matches are everywhere in prose, and shadows of them taught the controller
# to draft in chat replies where verified drafts then failed (docs/decisions/0005-shadow-drafts-off.md).
SHADOW_MIN_MATCH = 4


@dataclass
class ShadowDraft:
    """A draft offered at a plain step and not verified, settled by the tokens emitted after it."""

    tokens: list[int]
    draft_class: DraftClass | None
    position: int  # committed tokens (prompt and output) the draft follows
    accepted: int = 0  # leading tokens the emitted ones matched so far
    settled: bool = False

    def feed(self, emitted: Iterable[int]) -> bool:
        """The next tokens the target emitted after the draft's context; True once the draft is settled (a
        token differed, or every drafted token matched), after which `accepted` is final."""
        for token in emitted:
            if self.settled:
                break
            if token != self.tokens[self.accepted]:
                self.settled = True
                break
            self.accepted += 1
            self.settled = self.accepted == len(self.tokens)
        return self.settled

    def to_dict(self) -> dict[str, object]:
        return {
            "position": self.position,
            "draft_class": None if self.draft_class is None else self.draft_class.name,
            "tokens": list(self.tokens),
            "drafted": len(self.tokens),
            "accepted": self.accepted,
        }
