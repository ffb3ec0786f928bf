"""The copy cursor's moves on its own: in step with the source, into an edit, realigned after it (the edit
remembered and applied to later drafts, and followed where it is made again), and given up."""

from spekula.proposers.copy_cursor import MAX_SUBSTITUTED, RESYNC_PATIENCE, RESYNC_WINDOW, CopyCursor

NAME = 50
SOURCE = [*range(100, 110), NAME, *range(110, 120), NAME, *range(120, 130)]  # a name at 10 and at 21


def following(at: int = 0, synced: int = 4) -> CopyCursor:
    cursor = CopyCursor()
    cursor.start((SOURCE, at), synced)
    return cursor


def test_in_step_the_cursor_moves_with_the_source():
    cursor = following()
    cursor.follow(SOURCE[:6])
    assert cursor.in_step and cursor.source == (SOURCE, 6) and cursor.synced == 4 + 6
    assert cursor.draft(3) == SOURCE[6:9] and cursor.draft(100) == SOURCE[6:]
    cursor.follow([])
    assert cursor.source == (SOURCE, 6)


def test_a_token_off_the_source_starts_an_edit_and_the_cursor_waits():
    cursor = following()
    cursor.follow([*SOURCE[:10], 7])  # 7 where the name was
    assert cursor.edit == [7] and not cursor.in_step and not cursor.realigned
    assert cursor.source == (SOURCE, 10)  # where the edit began
    cursor.follow([8])
    assert cursor.edit == [7, 8] and cursor.source == (SOURCE, 10)


def test_two_source_tokens_in_a_row_after_an_edit_realign_it_and_the_edit_is_remembered():
    cursor = following()
    cursor.follow([*SOURCE[:10], 7, 8, 110])  # the name replaced by two tokens, then the source again
    assert cursor.edit and not cursor.realigned  # one source token after the edit is not enough
    cursor.follow([111])
    assert cursor.in_step and cursor.realigned and cursor.source == (SOURCE, 13)
    assert cursor.synced == 4 + 10 + 2  # the match, the copy before the edit, the two found again
    assert cursor.substitutions == {(NAME,): (7, 8)}
    # later drafts apply it: the name's next occurrence is drafted as the output writes it
    assert cursor.draft(12) == [*SOURCE[13:21], 7, 8, *SOURCE[22:24]]


def test_an_edit_made_again_keeps_the_cursor_in_step():
    cursor = following()
    cursor.follow([*SOURCE[:10], 7, 8, *SOURCE[11:21], 7])  # the remembered edit, begun at its next place
    assert cursor.in_step and cursor.source == (SOURCE, 22)  # past the replaced span
    assert cursor.draft(3) == [8, *SOURCE[22:24]]  # the rest of the edit first
    synced = cursor.synced
    cursor.follow([8, *SOURCE[22:24]])
    assert cursor.in_step and cursor.source == (SOURCE, 24) and cursor.synced == synced + 3
    left = following()
    left.follow([*SOURCE[:10], 7, 8, *SOURCE[11:21], 7, 60])  # leaves the remembered edit halfway: an edit again
    assert left.edit == [60]


def test_only_short_replacements_are_remembered():
    cursor = following()
    dropped = MAX_SUBSTITUTED + 1  # source tokens an edit replaces, one more than a substitution holds
    cursor.follow([*SOURCE[:2], 7, *SOURCE[2 + dropped : 4 + dropped]])
    assert cursor.realigned and cursor.source == (SOURCE, 4 + dropped) and cursor.substitutions == {}


def test_the_cursor_realigns_only_within_its_window():
    cursor = following()
    far = 1 + RESYNC_WINDOW  # the output skips more source than the window searches
    cursor.follow([*SOURCE[:2], 7, *SOURCE[2 + far : 4 + far]])
    assert not cursor.realigned and cursor.edit == [7, *SOURCE[2 + far : 4 + far]]


def test_the_cursor_gives_up_after_its_patience():
    cursor = following()
    cursor.follow([*SOURCE[:10], *range(1, 1 + RESYNC_PATIENCE)])
    assert cursor.source is not None and len(cursor.edit) == RESYNC_PATIENCE
    cursor.follow([RESYNC_PATIENCE + 1])
    assert cursor.source is None and cursor.edit == [] and not cursor.in_step
    cursor.follow(SOURCE)  # nothing to follow until it is started again
    assert cursor.source is None


def test_a_new_start_keeps_what_the_edits_replaced():
    cursor = following()
    cursor.follow([*SOURCE[:10], 7, 8, 110, 111])
    cursor.stop()
    assert cursor.source is None and cursor.substitutions == {(NAME,): (7, 8)}
    cursor.start((SOURCE, 20), 8)
    assert cursor.in_step and not cursor.realigned and cursor.synced == 8
    assert cursor.draft(3) == [SOURCE[20], 7, 8]


def test_a_draft_outside_the_vocabulary_is_no_draft():
    cursor = following()
    assert cursor.draft(4, vocab_size=200) == SOURCE[:4]
    assert cursor.draft(4, vocab_size=102) == []
