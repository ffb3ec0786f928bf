"""How a fresh prefill computes a prompt's rows: in which kinds of passes (Capabilities.pass_kind_widths).

Where a row's bits depend on the kind of pass that computed it (llama.cpp's exact mode), a prompt cache may give a
request only kept rows that a fresh prefill of its own prompt would compute alike (spekula.prompt_cache, decision
0018). A fresh prefill runs a prompt's rows in wide passes; a conversation's answers were decoded in narrow ones (a
step's: one token, or a verified block). So a next turn could not take its last answer's rows, and prefilled them
again. A prefill plan fixes, from the prompt's token ids alone, which rows a fresh prefill computes as a step does:
the assistant's messages in the history (TurnMarkers: the chat template's header before an assistant's text and the
tokens that end it), in passes no wider than a verified block; everything else in wide passes as before. The plan is
a function of the prompt, so a request's text still does not depend on the requests before it, and a next turn takes
its last answer from the cache (docs/decisions/0019-assistant-turns-prefilled-as-steps.md).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from spekula.backends.base import pass_kind


@dataclass(frozen=True)
class TurnMarkers:
    """Where a chat template's assistant messages lie in a prompt's token ids: each starts after `header` (the
    tokens a generation prompt adds, e.g. Qwen's `<|im_start|>assistant\\n`) and ends before the first of `ends`
    (the token that closes a message, e.g. `<|im_end|>`, and the end-of-sequence tokens). TextCodec.turn_markers
    finds them in a model's template."""

    header: tuple[int, ...]
    ends: frozenset[int]

    def __post_init__(self) -> None:
        if not self.header or not self.ends:
            raise ValueError("TurnMarkers needs a header and at least one end token")

    def spans(self, tokens: Seq[int]) -> list[tuple[int, int]]:
        """[start, end) of every assistant message that ends inside `tokens` (an unclosed last one, a prompt that
        continues the assistant's text, is not one: its rows are the prompt's)."""
        header, ends, first = list(self.header), self.ends, self.header[0]
        found: list[tuple[int, int]] = []
        at, n = 0, len(tokens)
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        while True:
            try:
                at = tokens.index(first, at)
            except ValueError:
                return found
            start = at + len(header)
            if tokens[at:start] != header:
                at += 1
                continue
            end = start
            while end < n and tokens[end] not in ends:
                end += 1
            if end >= n:
                return found
            if end > start:
                found.append((start, end))
            at = end


@dataclass(frozen=True)
class PrefillPlan:
    """One prompt's fresh prefill: `narrow` spans of its prefix (the prompt but its last token) computed as a step's
    rows, in passes no wider than a verified block (kind 0), the rest in wide segments, each as Generation.prefill_chunk
    chunks a prompt: one pass where it is narrower than `least` (Capabilities.prefill_min_rows), else passes of at
    least that many. The last segment holds the prompt's last token too (a step scores it: the prompt's last chunk
    and it go as one pass, or it alone where the prompt was prefilled to the end first)."""

    length: int  # the prefix's tokens
    narrow: tuple[tuple[int, int], ...]  # [start, end), in order, each ending before `length`
    widths: tuple[int, ...]  # Capabilities.pass_kind_widths
    least: int  # Capabilities.prefill_min_rows

    @classmethod
    def of(cls, prefix: Seq[int], widths: Seq[int], least: int, markers: TurnMarkers | None = None) -> PrefillPlan:
        narrow = tuple(markers.spans(prefix)) if markers is not None and widths else ()
        return cls(len(prefix), narrow, tuple(widths), least)

    def segment(self, position: int) -> tuple[int, int, bool]:
        """The segment holding `position` (< length): its [start, end) in the prefix and whether it is narrow."""
        start = 0
        for s, e in self.narrow:
            if position < s:
                return start, s, False
            if position < e:
                return s, e, True
            start = e
        return start, self.length, False

    def chunk(self, start: int, budget: int | None) -> tuple[int, bool]:
        """The end of the next prefill chunk from `start` (< length), at most `budget` tokens (None: the segment's
        rest) where the segment allows it, and whether it is narrow: a chunk never crosses a segment's edge, and in a
        wide one it has at least `least` rows and leaves none or at least that many."""
        s, e, narrow = self.segment(start)
        end = e if budget is None else min(start + budget, e)
        if not narrow and end < e and self.least > 1:
            end = min(max(end, start + self.least), e)
            if e - end < self.least:
                end = e
        return end, narrow

    def kind(self, position: int) -> int:
        """The kind of pass a fresh prefill computes `position`'s row in (< length)."""
        s, e, narrow = self.segment(position)
        return self._kind_of(s, e, narrow)

    def _kind_of(self, start: int, end: int, narrow: bool) -> int:
        """A segment's pass kind: a step's if narrow, else its width's (the last one with the prompt's last token)."""
        return 0 if narrow else pass_kind(end - start + (end == self.length), self.widths)

    def reusable(self, kinds: Seq[int], shared: int) -> int:
        """How many leading rows a request with this plan may take from a sequence whose rows' kinds are `kinds` and
        that shares `shared` tokens with its prefix, counted from the first: rows computed in the kind
        of pass the plan computes them in, segment by segment, and where the taken ones end inside a wide segment
        (or take the last one, which a step then finishes), only so many that the segment's rows left still make a
        pass of its kind."""
        taken = 0
        while taken < self.length:
            s, e, narrow = self.segment(taken)
            kind = self._kind_of(s, e, narrow)
            stop, limit = taken, min(shared, e)
            while stop < limit and kinds[stop] == kind:
                stop += 1
            if stop == e < self.length:  # all of this segment: on to the next
                taken = e
                continue
            if kind and stop > s:  # the segment's rest, prefilled alone, is a pass of its kind
                stop = max(s, min(stop, e - self.widths[kind - 1]))
            return stop
        return taken
