from spekula.config import SamplingParams
from spekula.draft_class import NO_DRAFT, ngram_class
from spekula.proposers.ngram import NgramProposer


def propose(context, k=4, nmax=3, nmin=1):
    return NgramProposer(nmax, nmin).propose(context, k, SamplingParams(), None).tokens


def test_longest_match_wins_and_most_recent_occurrence():
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 1, 2, 3, 9, 1, 2, 4, 8, 1, 2]
    # suffix (1, 2): most recent earlier occurrence at 5..6 -> continuation 4, 8, 1, 2
    assert propose(context) == [4, 8, 1, 2]
    # a 3-gram match beats a shorter one even when older
    context = [7, 1, 2, 3, 3, 0, 2, 9, 7, 1, 2]
    assert propose(context, k=2) == [3, 3]


def test_no_match_gives_empty_draft():
    assert propose([1, 2, 3, 4]) == []
    assert propose([1], nmin=1) == []


def test_min_n_respected():
    assert propose([4, 1, 9, 1], nmin=2) == []
    assert propose([4, 1, 9, 1], nmin=1) == [9, 1]


def test_incremental_index_matches_fresh_one():
    p = NgramProposer(3, 1)
    context = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    for end in range(2, len(context) + 1):
        got = p.propose(context[:end], 3, SamplingParams(), None).tokens
        assert got == NgramProposer(3, 1).propose(context[:end], 3, SamplingParams(), None).tokens


def test_draft_class_is_the_matched_length():
    p = NgramProposer(4, 1)
    assert p.draft_class([5, 1, 2, 3, 4, 9, 1, 2, 3, 4]) == ngram_class(4)
    assert p.draft_class([5, 1, 2, 3, 4, 9, 7, 2, 3, 4, 0, 6, 3, 4]) == ngram_class(2)
    assert p.draft_class([5, 1, 2, 3, 4, 9, 7, 2, 3, 4, 0, 6, 3, 4]).length == 2
    assert p.draft_class([1, 2, 3]) == NO_DRAFT  # nothing seen before: nothing to draft
    # the class says what propose() would do: a draft exactly when there is a match
    context = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    for end in range(1, len(context) + 1):
        has_draft = bool(NgramProposer(4, 1).propose(context[:end], 3, SamplingParams(), None).tokens)
        assert (p.draft_class(context[:end]) != NO_DRAFT) == has_draft


def test_draft_length_is_what_a_draft_can_hold_before_drafting():
    context = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 1, 4]
    for end in range(1, len(context) + 1):
        p = NgramProposer(3, 1)
        longest = p.draft_length(context[:end])
        assert longest == len(NgramProposer(3, 1).propose(context[:end], 99, SamplingParams(), None).tokens)
        assert (longest == 0) == (p.draft_class(context[:end]) == NO_DRAFT)
