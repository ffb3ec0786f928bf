"""The copy cursor: where in a copied text the output is, through the edits it makes (suffix lookup's).

A request that copies a text with edits (rename a variable, add type hints, respace operators) breaks every
suffix match at every edit. The cursor keeps the text a long match was copying (its source) and the index in
it of the token expected next, and moves over each committed token (follow): on while the output is the
source's, or what a remembered substitution put in place of a source span (an edit made again). Any other
token starts an edit; the cursor realigns where two tokens in a row after it are found again in the source,
within RESYNC_WINDOW tokens of where the edit began, or gives up after RESYNC_PATIENCE tokens off the source.
What an edit replaced (at most MAX_SUBSTITUTED source tokens) is remembered for the request, and drafts from
the cursor apply it (draft). SuffixProposer decides when the cursor is set (start) and when its draft is used.
"""

from __future__ import annotations

# The window of source tokens searched for the tokens the output emits after an edit, and how many tokens off
# the source the cursor waits before it gives up.
RESYNC_WINDOW = 8
RESYNC_PATIENCE = 6
MAX_SUBSTITUTED = 4  # source tokens an edit may replace to be remembered as a substitution
MAX_SUBSTITUTIONS = 32  # substitutions a request remembers, the latest (each draft from the cursor tries them all)


class CopyCursor:
    """One request's copy cursor.

    source: (the text being copied, the index in it of the token expected next); None: not copying.
    edit: the tokens emitted off the source since an edit began (empty: in step with the source).
    realigned: the cursor found its place again after an edit, so drafts may follow it.
    synced: tokens of the source followed: the match that set the cursor, then every token in step with it,
    edits skipped (a long copy interrupted by an edit is as good evidence after it as before).
    substitutions: what this request's edits replaced, a few source tokens -> the tokens the output put there.
    """

    def __init__(self) -> None:
        self.source: tuple[list[int], int] | None = None
        self.edit: list[int] = []
        self.realigned = False
        self.synced = 0
        self.substitutions: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._heads: set[int] = set()  # the first source token of each substituted span
        self._candidate: int | None = None  # where the source would go on if the last token realigned the cursor
        self._inserting: tuple[int, ...] = ()  # the rest of a substitution the output is inside (the span is passed)

    @property
    def in_step(self) -> bool:
        """Copying, and the output is where the source says (no edit under way)."""
        return self.source is not None and not self.edit

    def start(self, source: tuple[list[int], int], synced: int) -> None:
        """Follow `source` (text, index of the next token) from here: a match of `synced` tokens found it."""
        self.source, self.realigned, self.edit, self._inserting = source, False, [], ()
        self.synced = synced

    def stop(self) -> None:
        """Copy nothing (the context started over); the substitutions are kept."""
        self.source, self._inserting = None, ()

    def draft(self, limit: int, vocab_size: int | None = None) -> list[int]:
        """The source from the cursor on, up to `limit` tokens, with this request's substitutions applied (the
        rest of one the output is inside first); [] if a token falls outside the vocabulary."""
        assert self.source is not None  # called while following a source
        seq, at = self.source
        out: list[int] = list(self._inserting)
        while len(out) < limit and at < len(seq):
            span = self._substituted_at(seq, at)
            if span is None:
                out.append(seq[at])
                at += 1
            else:
                out.extend(self.substitutions[span])
                at += len(span)
        out = out[:limit]
        if vocab_size is not None and not all(0 <= t < vocab_size for t in out):
            return []
        return out

    def follow(self, tokens: list[int]) -> None:
        """Move over newly committed tokens: in step (_step), through an edit (_realign), or give up."""
        if self.source is None:
            return
        seq, at = self.source
        for token in tokens:
            if not self.edit:
                at = self._step(seq, at, token)
                continue
            at = self._realign(seq, at, token)
            if self.source is None:
                return
        self.source = (seq, at)

    def _step(self, seq: list[int], at: int, token: int) -> int:
        """One token while in step: the source's next one, or a remembered substitution's (an edit made again);
        anything else starts an edit. Returns the cursor's index after it."""
        if self._inserting:  # inside a substitution: the rest of what the edit put there
            if token == self._inserting[0]:
                self._inserting = self._inserting[1:]
                self.synced += 1
                return at
            self._inserting = ()  # the output left it: an edit from the span's start on
        elif at < len(seq) and seq[at] == token:
            self.synced += 1
            return at + 1
        else:
            span = self._substituted_at(seq, at)
            if span is not None and self.substitutions[span][0] == token:  # an edit made again
                self._inserting = self.substitutions[span][1:]
                self.synced += 1
                return at + len(span)
        self.realigned, self.edit, self._candidate = False, [token], None
        return at

    def _realign(self, seq: list[int], at: int, token: int) -> int:
        """One token during an edit: realign where it follows the edit's latest token in the source (two in a
        row found again, within RESYNC_WINDOW of where the edit began), remembering what the edit replaced; give
        up (source None) after RESYNC_PATIENCE tokens off it. Returns the cursor's index after it."""
        if self._candidate is not None and self._candidate < len(seq) and seq[self._candidate] == token:
            found = self._candidate - 1  # the edit's first token found again, and this one after it
            self._remember(tuple(seq[at:found]), tuple(self.edit[:-1]))
            at = self._candidate + 1
            self.realigned, self.edit, self._candidate = True, [], None
            self.synced += 2  # the copy before the edit, and the two tokens found again after it
            return at
        self.edit.append(token)
        window = seq[at : at + RESYNC_WINDOW]
        self._candidate = at + window.index(token) + 1 if token in window else None
        if len(self.edit) > RESYNC_PATIENCE:
            self.source, self.edit, self._candidate = None, [], None
        return at

    def _remember(self, replaced: tuple[int, ...], inserted: tuple[int, ...]) -> None:
        """An edit put `inserted` where the source had `replaced`: a substitution, if short enough to be one."""
        if not inserted or not 0 < len(replaced) <= MAX_SUBSTITUTED:
            return
        self.substitutions.pop(replaced, None)  # the latest edit of these tokens wins, and is newest
        self.substitutions[replaced] = inserted
        if len(self.substitutions) > MAX_SUBSTITUTIONS:
            del self.substitutions[next(iter(self.substitutions))]
        self._heads = {span[0] for span in self.substitutions}

    def _substituted_at(self, seq: list[int], at: int) -> tuple[int, ...] | None:
        """The longest source span this request's edits replaced that starts at seq[at] (None: none)."""
        if at >= len(seq) or seq[at] not in self._heads:
            return None
        best = None
        for span in self.substitutions:
            if (best is None or len(span) > len(best)) and tuple(seq[at : at + len(span)]) == span:
                best = span
        return best
