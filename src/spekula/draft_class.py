"""Draft classes: what a proposer knows of its next draft before drafting, as one value.

A proposer that can tell how promising its next draft is names the draft's class (Proposer.draft_class): n-gram
lookup the length of its match, suffix lookup a bucket of match lengths and where the match was found. The cost
model learns acceptance per class (spekula.cost: a class never seen starts from its match length), and the
controller keeps a request's own evidence per class *source* (spekula.control): this request's own text, earlier
requests' outputs, or the copy cursor after an edit, since sources fail apart.

A class is a value, read by its fields: nobody parses its name. The name (str(draft_class)) is what step records,
traces and reports print: "4-gram", "suffix-8..15", "recall-16+", "resync-2..3", "no draft".
"""

from __future__ import annotations

from dataclasses import dataclass

# A class's source (DraftClass.source): where the text it drafts comes from.
CONTEXT = "context"  # this request's own text (n-gram lookup, suffix lookup, a draft model)
RECALLED = "recall"  # earlier requests' outputs (suffix lookup's memory), not this request's own text
AFTER_EDIT = "resync"  # a copied text followed again after an edit (suffix lookup's copy cursor)
SOURCES = (CONTEXT, RECALLED, AFTER_EDIT)

# Kinds of class that name a match length, besides RECALLED and AFTER_EDIT (which are their own source's kind).
N_GRAM = "gram"  # n-gram lookup: a match of exactly `length` tokens ("4-gram")
SUFFIX = "suffix"  # suffix lookup, the match in this request's own text ("suffix-8..15")


@dataclass(frozen=True)
class DraftClass:
    """One class of drafts: its kind, and the match lengths it holds (length .. longest).

    kind: N_GRAM, SUFFIX, RECALLED or AFTER_EDIT for a class with a match length; any other label for one that
    names none (NO_DRAFT, or a proposer's own label), which is then its whole name.
    length: the shortest match the class holds (None: it names none), which its base acceptance is computed from.
    longest: the longest; None with a length: no bound ("suffix-16+").
    """

    kind: str
    length: int | None = None
    longest: int | None = None

    @property
    def source(self) -> str:
        """Where the text this class drafts comes from: RECALLED, AFTER_EDIT or CONTEXT (anything else)."""
        return self.kind if self.kind in (RECALLED, AFTER_EDIT) else CONTEXT

    @property
    def name(self) -> str:
        """How step records, traces and reports print the class."""
        if self.length is None:
            return self.kind
        if self.kind == N_GRAM:
            return f"{self.length}-{N_GRAM}"
        if self.longest is None:
            return f"{self.kind}-{self.length}+"
        if self.longest == self.length:
            return f"{self.kind}-{self.length}"
        return f"{self.kind}-{self.length}..{self.longest}"

    def __str__(self) -> str:
        return self.name


NO_DRAFT = DraftClass("no draft")  # the proposer has nothing to offer now (k = 0, not a decision)


def ngram_class(n: int) -> DraftClass:
    """n-gram lookup's class after a match of n tokens ("4-gram")."""
    return DraftClass(N_GRAM, n, n)


def draft_source(draft_class: DraftClass | None) -> str:
    """A class's source; CONTEXT where the proposer names no class (a draft model drafts from this request's
    own text)."""
    return CONTEXT if draft_class is None else draft_class.source
