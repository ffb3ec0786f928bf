"""Draft classes as values: the source of each, and the names step records, traces and reports print."""

import dataclasses

import pytest

from spekula.draft_class import (
    AFTER_EDIT,
    CONTEXT,
    NO_DRAFT,
    RECALLED,
    SOURCES,
    DraftClass,
    draft_source,
    ngram_class,
)
from spekula.proposers.suffix import CLASS_BOUNDS, match_class
from spekula.shadow import ShadowDraft


def test_every_draft_class_has_one_source():
    for length in (*CLASS_BOUNDS, 40):  # every class suffix lookup makes, of each kind
        assert match_class(length, RECALLED).source == RECALLED
        assert match_class(length, AFTER_EDIT).source == AFTER_EDIT
        assert match_class(length).source == CONTEXT
    # n-gram lookup, nothing to draft, a proposer's own label, a draft model (no class): this request's own text
    assert ngram_class(3).source == NO_DRAFT.source == DraftClass("server-rule").source == CONTEXT
    assert draft_source(None) == CONTEXT and draft_source(match_class(4, RECALLED)) == RECALLED
    assert set(SOURCES) == {CONTEXT, RECALLED, AFTER_EDIT}


def test_a_class_prints_its_name():
    assert [str(ngram_class(n)) for n in (1, 4, 12)] == ["1-gram", "4-gram", "12-gram"]
    assert str(match_class(1)) == "suffix-1" and str(match_class(9)) == "suffix-8..15"
    assert str(match_class(3, AFTER_EDIT)) == "resync-2..3" and str(match_class(40, RECALLED)) == "recall-16+"
    assert str(NO_DRAFT) == "no draft" and str(DraftClass("server-rule")) == "server-rule"
    assert ngram_class(4).name == "4-gram"


def test_a_class_is_a_hashable_value_told_apart_by_its_fields():
    assert ngram_class(4) == ngram_class(4) and len({ngram_class(4), ngram_class(4), ngram_class(2)}) == 2
    assert match_class(9) == match_class(12) == DraftClass("suffix", 8, 15)  # one bucket, one class
    assert ngram_class(1) != match_class(1) != match_class(1, RECALLED)  # one length, learnt apart by kind
    assert match_class(16) != match_class(8) and NO_DRAFT != DraftClass("no draft", 1, 1)
    assert (match_class(8).length, match_class(8).longest) == (8, 15) and match_class(16).longest is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        ngram_class(4).length = 5


def test_a_shadow_draft_writes_its_class_by_name():
    shadow = ShadowDraft([1, 2], match_class(20, AFTER_EDIT), 3)
    assert shadow.to_dict()["draft_class"] == "resync-16+"
    assert ShadowDraft([1], None, 0).to_dict()["draft_class"] is None
