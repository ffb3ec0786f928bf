"""Suffix lookup: the index and its counts, longest match, draft by frequency, match-length-dependent
draft length, the cross-request cache (LRU by entries and bytes, bounded memory, namespaces), and the
engine: greedy output identical to plain decoding, drafts accepted on repetitive text; namespaces kept
apart through the pipeline; the knobs a user sets (SpecConfig.suffix, --suffix-*)."""

from __future__ import annotations

import argparse
import gc
import random
import tracemalloc

import pytest
import torch

from spekula.config import K_MAX, SamplingParams, SpecConfig, StopConfig, SuffixOptions
from spekula.draft_class import AFTER_EDIT, NO_DRAFT, RECALLED, DraftClass
from spekula.engine import Engine
from spekula.errors import ConfigError
from spekula.options import add_model_options, add_suffix_options, spec_from_args
from spekula.pipeline import Pipeline
from spekula.proposers import SUFFIX, build_proposer, needs_model
from spekula.proposers.suffix import (
    ANCHORS,
    BYTES_PER_ENTRY,
    BYTES_PER_TOKEN,
    SuffixCache,
    SuffixConfig,
    SuffixFactory,
    SuffixIndex,
    SuffixProposer,
    common_suffix,
    match_class,
)
from spekula.testing import FunctionBackend, random_table_backend
from spekula.text import TextCodec

from pipelinekit import EOS, ByteTokenizer, SlowBackend, printable_table
from pipelinekit import VOCAB as BYTES

GREEDY = SamplingParams()
DEFAULTS = SuffixConfig()
# The cache's own tests draft from memory after short matches: min_recall_match is tested on its own.
ANY_RECALL = SuffixConfig(min_recall_match=1)
ANY_RECALL_4 = SuffixConfig(spec_factor=4.0, min_recall_match=1)


def propose(context, k=8, config=DEFAULTS, cache=None, namespace=""):
    return SuffixProposer(config, cache, namespace).propose(context, k, GREEDY, None).tokens


def continuations(index: SuffixIndex, suffix: list[int]) -> dict[int, int]:
    """The counts at the trie node of `suffix`: how often each token followed an occurrence of it."""
    level = max(i for i, n in enumerate(ANCHORS) if n <= len(suffix))
    key = suffix[-1] if ANCHORS[level] == 1 else hash(tuple(suffix[-ANCHORS[level] :]))
    counts: dict[int, int] = {}
    for _, seq, end in index.occurrences(level, key, limit=10**9):
        if end >= len(suffix) and common_suffix(seq, end, suffix, len(suffix)) == len(suffix):
            counts[seq[end]] = counts.get(seq[end], 0) + 1
    return counts


def table_sizes(index: SuffixIndex) -> list[int]:
    """Position codes held by each anchor table."""
    return [sum(1 if type(v) is int else len(v) for v in table.values()) for table in index.tables]


# -- the index --------------------------------------------------------------------------------------


def test_counts_after_inserting_sequences():
    index = SuffixIndex()
    index.extend(0, [1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert continuations(index, [1, 2]) == {3: 2, 4: 1}
    assert continuations(index, [2]) == {3: 2, 4: 1}
    assert continuations(index, [1, 2, 3]) == {1: 1}  # the last 1, 2, 3 has no continuation yet
    index.extend(7, [5, 1, 2, 3, 1, 2, 3])
    assert continuations(index, [1, 2]) == {3: 4, 4: 1}
    assert continuations(index, [1, 2, 3]) == {1: 2}
    assert continuations(index, [5, 1, 2, 3, 1]) == {2: 1}
    assert continuations(index, [9]) == {}
    # every position with a continuation is indexed once per anchor that fits before it
    assert table_sizes(index) == [8 + 6, 7 + 5, 5 + 3, 1 + 0]
    with pytest.raises(ValueError, match="only the newest may grow"):  # the lists would no longer be sorted
        index.extend(0, [1])
    index.remove(0)
    assert continuations(index, [1, 2]) == {3: 2}
    assert table_sizes(index) == [6, 5, 3, 0]
    index.remove(7)
    assert [len(t) for t in index.tables] == [0, 0, 0, 0] and len(index) == 0


def test_common_suffix():
    seq = [9, 1, 2, 3, 4, 5]
    assert common_suffix(seq, 4, [7, 2, 3], 3) == 2
    assert common_suffix(seq, 4, [1, 2, 3], 3) == 3
    assert common_suffix(seq, 4, [0, 1, 2, 3], 4) == 3
    assert common_suffix(seq, 4, [8], 1) == 0


def test_incremental_update_equals_rebuild():
    """The index grown a few tokens at a time finds what one built at once finds. (Drafts may differ: the copy
    cursor's depend on the path the request's output took, by design.)"""
    rng = random.Random(0)
    context = [rng.randrange(6) for _ in range(300)]
    p = SuffixProposer(SuffixConfig(cache_entries=0))
    end = 5
    p.observe(context[:end], None)
    while end < len(context):
        end = min(len(context), end + rng.randint(1, 9))
        p.observe(context[:end], None)
        fresh = SuffixProposer(SuffixConfig(cache_entries=0))
        fresh.observe(context[:end], None)
        got, want = p._lookup(), fresh._lookup()
        assert (got and (got.length, got.tokens)) == (want and (want.length, want.tokens))
    rebuilt = SuffixIndex()
    rebuilt.extend(0, context)
    assert p._local.tables == rebuilt.tables and p._local.seqs == rebuilt.seqs


# -- drafting ---------------------------------------------------------------------------------------


def test_longest_match_wins():
    #          0  1  2  3  4  5  6  7  8  9 10 11
    context = [7, 1, 2, 3, 3, 0, 9, 2, 3, 5, 1, 2, 3]
    # (2, 3) and (3) occur more recently, but (1, 2, 3) is the longest suffix seen before
    p = SuffixProposer(SuffixConfig(spec_factor=4.0))
    match = p.match(context)
    assert match.length == 3 and match.tokens[:3] == [3, 0, 9]
    assert p.draft_class(context) == match_class(2) == DraftClass("suffix", 2, 3)


def test_draft_follows_the_most_frequent_continuation():
    # after (8, 1): 4 twice, 6 once (the most recent); n-gram lookup would take the most recent
    context = [8, 1, 4, 0, 8, 1, 4, 2, 8, 1, 6, 3, 8, 1]
    split = SuffixConfig(spec_factor=1.0, unanimous_first=False)  # SuffixDecoding's rule from the first token on
    assert propose(context, config=split) == [4, 2]  # then 2 and 0 tie: the most recent
    # a tie goes to the most recent occurrence
    assert propose([5, 1, 2, 5, 1, 3, 5, 1], config=split) == [3, 5]


def test_a_split_match_drafts_nothing_by_default():
    """Occurrences of the match that disagree on the next token: no draft, and the class says so beforehand (the
    controller is not asked to bet on it); one more occurrence that agrees is not enough, all must."""
    context = [8, 1, 4, 0, 8, 1, 6, 3, 8, 1]  # (8, 1) then 4 once, 6 once
    assert propose(context) == []
    assert SuffixProposer().draft_class(context) == NO_DRAFT
    assert propose([8, 1, 4, 0, 8, 1, 4, 2, 8, 1, 6, 3, 8, 1]) == []  # 4 twice, 6 once: still split
    # 4 twice: unanimous; after it 0 and 2 tie, and the draft goes on as SuffixDecoding's does (the most recent)
    assert propose([8, 1, 4, 0, 8, 1, 4, 2, 8, 1]) == [4, 2]
    assert propose(context, config=SuffixConfig(unanimous_first=False)) == [6, 3]  # SuffixDecoding's rule: a guess


def test_draft_stops_when_the_continuation_is_improbable():
    context = [1, 9, 1, 8, 1, 7, 1, 6, 1]  # four continuations of (1), each 1/4
    split = {"unanimous_first": False}
    assert propose(context, config=SuffixConfig(min_token_prob=0.3, **split)) == []
    assert SuffixProposer(SuffixConfig(min_token_prob=0.3, **split)).draft_class(context) == NO_DRAFT
    assert propose(context, config=SuffixConfig(min_token_prob=0.25, **split)) == [6]


def test_draft_length_depends_on_the_match_length():
    prefix = list(range(10, 30))
    context = [*prefix, 99, *prefix[:2]]  # matches (10, 11) only: 2 tokens
    assert propose(context, k=8) == [12, 13]
    assert propose(context, k=8, config=SuffixConfig(spec_factor=2.0)) == [12, 13, 14, 15]
    assert propose(context, k=3, config=SuffixConfig(spec_factor=2.0)) == [12, 13, 14]
    assert propose(context, k=8, config=SuffixConfig(spec_factor=1.0, spec_offset=1.0)) == [12, 13, 14]
    long = [*prefix, 99, *prefix[:12]]
    assert propose(long, k=16) == prefix[12:] + [99] + prefix[:3]  # a 12-token match: up to 12 tokens
    assert propose(long, k=16, config=SuffixConfig(max_draft=5)) == prefix[12:17]


def test_draft_length_is_what_a_draft_can_hold_before_drafting():
    prefix = list(range(10, 30))
    for context, config in (
        ([*prefix, 99, *prefix[:2]], DEFAULTS),  # a 2-token match: 2 tokens
        ([*prefix, 99, *prefix[:2]], SuffixConfig(spec_factor=2.0)),
        ([*prefix, 99, *prefix[:12]], DEFAULTS),
        ([*prefix, 99, *prefix[:12]], SuffixConfig(max_draft=5)),
        ([1, 9, 1, 8, 1, 7, 1, 6, 1], SuffixConfig(min_token_prob=0.3)),  # no continuation probable enough
        ([1, 2, 3, 4], DEFAULTS),  # no match
    ):
        proposer = SuffixProposer(config)
        longest = proposer.draft_length(context)
        assert longest == len(propose(context, k=K_MAX, config=config))
        assert (longest == 0) == (proposer.draft_class(context) == NO_DRAFT)
    assert SuffixProposer().draft_length([*prefix, 99, *prefix[:2]]) == 2


def test_repeating_text_continues_past_the_end_of_the_context():
    context = [4, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    assert propose(context, k=8) == [1, 2, 3, 1, 2, 3]  # a 6-token match (3 periods overlap it)
    assert propose(context, k=8, config=SuffixConfig(spec_factor=2.0)) == [1, 2, 3, 1, 2, 3, 1, 2]


def test_no_match_no_draft():
    assert propose([1, 2, 3, 4]) == []
    assert propose([5]) == []
    assert SuffixProposer().draft_class([1, 2, 3]) == NO_DRAFT
    assert SuffixProposer().propose([1, 2, 1], 0, GREEDY, None).tokens == []


def test_draft_class_buckets_the_match_length():
    assert str(match_class(3, AFTER_EDIT)) == "resync-2..3" and str(match_class(20, AFTER_EDIT)) == "resync-16+"
    assert [str(match_class(n)) for n in (1, 2, 3, 4, 7, 8, 15, 16, 32)] == [
        "suffix-1",
        "suffix-2..3",
        "suffix-2..3",
        "suffix-4..7",
        "suffix-4..7",
        "suffix-8..15",
        "suffix-8..15",
        "suffix-16+",
        "suffix-16+",
    ]
    text = list(range(100, 140))
    p = SuffixProposer()
    assert p.draft_class([*text, 7, *text[:20]]) == match_class(16) == DraftClass("suffix", 16)
    assert p.match([*text, 7, *text[:20]]).length == 20
    deep = list(range(200, 300))
    assert SuffixProposer(SuffixConfig(max_depth=40)).match([*deep, 7, *deep[:60]]).length == 40


def follow(proposer, prompt, output):
    """Index `output` one committed token at a time, as the engine's steps do; the match after it."""
    for i in range(len(output) + 1):
        match = proposer.match(prompt + output[:i])
    return match


SOURCE = list(range(100, 110)) + [50] + list(range(110, 120)) + [50] + list(range(120, 130))  # 50: a name


def test_after_an_edit_the_copy_cursor_realigns_and_drafts_the_source():
    """The output copies the source, replaces one token (50) by two (7, 8), and copies on: once two
    tokens after the edit are found again in the source, the draft is the source from there, though
    the suffix match is only 2 tokens long. One token after the edit is not enough."""
    prompt = [*SOURCE, 99]
    p = SuffixProposer()
    one_after = follow(p, prompt, SOURCE[:10] + [7, 8, 110])
    assert one_after is None or not one_after.resync
    match = follow(p, prompt, SOURCE[:10] + [7, 8, 110, 111])
    # the class counts the source tokens the cursor followed: a 4-token match, 6 more, then 2 after the edit
    assert match.resync and p.draft_class(prompt + SOURCE[:10] + [7, 8, 110, 111]) == match_class(8, AFTER_EDIT)
    assert match.tokens[:8] == SOURCE[13:21]


def test_an_edit_is_applied_to_the_rest_of_the_copy():
    """What an edit replaced (50 -> 7, 8) is replaced in later drafts from the cursor too, so the second
    occurrence of the renamed token is drafted as the output will write it."""
    prompt = [*SOURCE, 99]
    p = SuffixProposer()
    match = follow(p, prompt, SOURCE[:10] + [7, 8] + SOURCE[11:17])
    # the cursor's draft, with its class: the 16 source tokens it followed, not the 6 matched since the edit
    assert match.resync and match.length == 16
    assert match.tokens[:6] == SOURCE[17:21] + [7, 8]
    assert 50 not in match.tokens


def test_an_edit_made_again_keeps_the_cursor_in_step():
    """Where the output makes a remembered edit again (50 -> 7, 8 at the name's next occurrence), the cursor
    moves over it as over the source: no new edit, no realigning, and the draft goes on from the source."""
    prompt = [*SOURCE, 99]
    p = SuffixProposer()
    output = SOURCE[:10] + [7, 8] + SOURCE[11:21] + [7]
    inside = follow(p, prompt, output)
    assert (
        not p.cursor.edit and inside.resync and inside.tokens[:3] == [8, *SOURCE[22:24]]
    )  # the rest of the edit first
    match = follow(p, prompt, [*output, 8, *SOURCE[22:24]])
    assert not p.cursor.edit and p.cursor.source[1] == 24
    assert match.resync and match.tokens[:4] == SOURCE[24:28]
    # an output that leaves the remembered edit halfway is an edit again
    q = SuffixProposer()
    follow(q, prompt, SOURCE[:10] + [7, 8] + SOURCE[11:21] + [7, 60])
    assert q.cursor.edit == [60]


def test_a_request_remembers_a_bounded_number_of_substitutions():
    """Each draft from the cursor tries every remembered substitution, so a long edited copy keeps the
    latest MAX_SUBSTITUTIONS only."""
    from spekula.proposers.copy_cursor import MAX_SUBSTITUTIONS

    words = [(1000 + i, 2000 + i, 3000 + i, 4000 + i, 6000 + i, 7000 + i) for i in range(60)]  # 2000 + i: a name
    source = [t for w in words for t in w]
    output = [t for w in words for t in (w[0], w[1] + 3000, *w[2:])]  # every name replaced
    p = SuffixProposer()
    follow(p, [*source, 99], output)
    assert len(words) > MAX_SUBSTITUTIONS and len(p.cursor.substitutions) == MAX_SUBSTITUTIONS
    assert p.cursor.substitutions.get((2059,)) == (5059,) and (2000,) not in p.cursor.substitutions  # the latest kept


def test_the_cursor_survives_any_edited_copy():
    """Copies with random edits (replaced, inserted and dropped tokens, some edits made again), committed a
    random number of tokens at a time: every draft is a list of in-vocabulary ids no longer than asked, and
    the draft class is one the controller can read."""
    rng = random.Random(3)
    for trial in range(40):
        source = [rng.randrange(40) for _ in range(rng.randint(20, 120))]
        renames = {t: [rng.randrange(40, 60) for _ in range(rng.randint(1, 3))] for t in rng.sample(range(40), 4)}
        output: list[int] = []
        for token in source:
            roll = rng.random()
            if roll < 0.05:
                continue  # dropped
            if roll < 0.1:
                output.append(rng.randrange(60))  # inserted
            output.extend(renames.get(token, [token]) if rng.random() < 0.7 else [token])
        p = SuffixProposer(vocab_size=60)
        prompt = [*source, 59]
        end = 0
        while end < len(output):
            context = prompt + output[:end]
            k = rng.randint(1, 16)
            draft = p.propose(context, k, GREEDY, None).tokens
            assert len(draft) <= k and all(0 <= t < 60 for t in draft), (trial, end)
            draft_class = p.draft_class(context)
            assert draft_class == NO_DRAFT or draft_class.length >= 1
            end += rng.randint(1, 4)


def test_the_cursor_gives_up_on_text_that_is_not_a_copy():
    prompt = [*SOURCE, 99]
    p = SuffixProposer()
    follow(p, prompt, SOURCE[:10] + [1, 2, 3, 4, 5, 6, 7, 8])
    assert p.cursor.source is None  # RESYNC_PATIENCE tokens off the source
    assert p.match(prompt + SOURCE[:10] + [1, 2, 3, 4, 5, 6, 7, 8, 110, 111]) is None or not p.cursor.realigned


def test_never_drafts_ids_outside_the_vocabulary():
    cache = SuffixCache(8, 1 << 20)
    cache.add("", [1, 2, 3, 500, 4])
    p = SuffixProposer(ANY_RECALL_4, cache, "", vocab_size=100)
    assert p.propose([9, 1, 2], 8, GREEDY, None).tokens == [3]
    assert SuffixProposer(ANY_RECALL_4, cache, "").propose([9, 1, 2], 8, GREEDY, None).tokens == [
        3,
        500,
        4,
    ]


def test_config_is_validated():
    for kwargs, words in [
        ({"max_depth": 0}, "--suffix-max-depth must be an integer >= 1"),
        ({"max_candidates": 1.5}, "max_candidates must be an integer >= 1"),
        ({"cache_entries": -1}, "--suffix-cache-entries must be an integer >= 0"),
        ({"cache_bytes": -5}, "cache_bytes must be an integer >= 0"),
        ({"spec_factor": 0}, "--suffix-spec-factor must be a number > 0"),
        ({"spec_offset": -1}, "spec_offset must be >= 0"),
        ({"min_token_prob": 1.5}, "--suffix-min-token-prob must be a probability >= 0 and <= 1"),
        ({"max_draft": 0}, "max_draft must be an integer >= 1"),
        ({"min_recall_match": 0}, "min_recall_match must be an integer >= 1"),
        ({"unanimous_first": "yes"}, "unanimous_first must be true or false"),
    ]:
        with pytest.raises(ConfigError, match=words):
            SuffixConfig(**kwargs)


# -- the cross-request cache ------------------------------------------------------------------------


def finish(factory, prompt, output, namespace=""):
    """A request over `prompt` that answered `output`, closed: its output joins the cache."""
    p = factory.create(namespace)
    p.observe(prompt, None)
    p.observe(prompt + output, None)
    p.close()


def test_a_finished_requests_output_drafts_later_requests():
    factory = SuffixFactory(ANY_RECALL_4)
    answer = [50, 51, 52, 53, 54, 55]
    finish(factory, [1, 2], answer)
    assert factory.cache.entries == 1 and factory.cache.tokens == len(answer)  # the output only
    assert factory.create().propose([3, 50, 51], 8, GREEDY, None).tokens == [52, 53, 54, 55]
    assert factory.create().propose([3, 1, 2], 8, GREEDY, None).tokens == []  # prompts are not cached by default
    with_prompts = SuffixFactory(SuffixConfig(cache_prompts=True, min_recall_match=1))
    finish(with_prompts, [1, 2], answer)
    assert with_prompts.create().propose([3, 1, 2], 8, GREEDY, None).tokens == [50, 51]


def test_a_match_only_in_earlier_requests_is_its_own_class_and_sets_no_cursor():
    """A draft that continues only other requests' outputs (a JSON template's keys, then that request's
    values) is accepted far less often than one continuing this request's own text, so the controller learns
    it apart ("recall-N"); and the copy cursor follows this request's own text only."""
    factory = SuffixFactory(SuffixConfig(spec_factor=4.0))
    earlier = list(range(200, 230))
    finish(factory, [1, 2], earlier)
    p = factory.create()
    context = [3, 4, *earlier[:10]]
    assert p.draft_class(context) == match_class(8, RECALLED) and p.match(context).recalled
    assert p.propose(context, 4, GREEDY, None).tokens == earlier[10:14]
    assert p.cursor.source is None
    # the same text in this request's own prompt: a suffix match, and the cursor follows it
    q = factory.create()
    own = [3, *earlier[:20], 5, *earlier[:10]]
    assert q.draft_class(own) == match_class(8) and q.cursor.source is not None
    assert p.draft_class(context).source == RECALLED and q.draft_class(own).source != RECALLED


def test_a_short_match_only_in_earlier_requests_drafts_nothing():
    """On a warm server a phrase of 1-3 tokens that earlier answers share is mostly followed by something else
    in a new answer: a match that only memory holds drafts from min_recall_match (4) tokens on. The request's
    own text drafts after any match, and a memory match of 4 tokens or more drafts as before."""
    factory = SuffixFactory(SuffixConfig(spec_factor=4.0))
    earlier = list(range(200, 230))
    finish(factory, [1, 2], earlier)
    for matched in (1, 2, 3):
        p = factory.create()
        context = [3, 4, *earlier[:matched]]
        assert p.match(context) is None and p.draft_class(context) == NO_DRAFT
        assert p.propose(context, 8, GREEDY, None).tokens == []
    p = factory.create()
    assert p.propose([3, 4, *earlier[:4]], 8, GREEDY, None).tokens == earlier[4:12]
    assert p.draft_class([3, 4, *earlier[:4]]) == match_class(4, RECALLED)
    # the same 2-token phrase in this request's own prompt drafts
    own = [*earlier[:5], 9, *earlier[:2]]
    q = factory.create()
    assert q.propose(own, 8, GREEDY, None).tokens[:3] == earlier[2:5] and not q.match(own).recalled
    # the bound is the config's: 1 drafts memory after any match
    assert SuffixFactory(ANY_RECALL_4).create().propose([3, 4, earlier[0]], 8, GREEDY, None).tokens == []  # no memory
    anyr = SuffixFactory(ANY_RECALL_4)
    finish(anyr, [1, 2], earlier)
    assert anyr.create().propose([3, 4, earlier[0]], 8, GREEDY, None).tokens == earlier[1:5]


def test_namespaces_never_see_each_others_text():
    factory = SuffixFactory(ANY_RECALL_4)
    secret = [70, 71, 72, 73, 74]
    finish(factory, [1, 2], secret, namespace="alice")
    finish(factory, [1, 2], [80, 81, 82], namespace="bob")
    assert factory.create("alice").propose([70, 71], 8, GREEDY, None).tokens == [72, 73, 74]
    bob = factory.create("bob")
    assert bob.propose([70, 71], 8, GREEDY, None).tokens == []
    assert bob.draft_class([70, 71]) == NO_DRAFT
    assert factory.create("").propose([70, 71], 8, GREEDY, None).tokens == []
    # fuzz: bob's drafts only ever hold tokens bob's own text contains
    rng = random.Random(1)
    for _ in range(200):
        context = [rng.choice([70, 71, 72, 73, 74, 80, 81, 82]) for _ in range(rng.randint(1, 6))]
        drafted = set(factory.create("bob").propose(context, 8, GREEDY, None).tokens)
        assert drafted <= {80, 81, 82} | set(context)


def test_lru_eviction_by_entries():
    cache = SuffixCache(max_entries=3, max_bytes=1 << 30)
    ids = [cache.add("", [100 * i + j for j in range(5)]) for i in range(3)]
    SuffixProposer(ANY_RECALL, cache).propose([9, 0, 1], 4, GREEDY, None)  # entry 0 serves a draft
    cache.add("", [400, 401, 402])  # evicts the least recently used: entry 1, not entry 0
    assert cache.entries == 3
    assert propose([9, 0, 1], config=ANY_RECALL, cache=cache) == [2, 3]
    assert propose([9, 100, 101], config=ANY_RECALL, cache=cache) == []
    assert propose([9, 200, 201], config=ANY_RECALL, cache=cache) == [202, 203]
    assert ids == [0, 1, 2]


def test_lru_eviction_by_bytes():
    entry = 30 * BYTES_PER_TOKEN + BYTES_PER_ENTRY  # what a 30-token entry counts for
    max_bytes = 3 * entry + 10
    cache = SuffixCache(max_entries=1000, max_bytes=max_bytes)
    for i in range(50):
        cache.add("", list(range(1000 * i, 1000 * i + 30)))
        assert cache.nbytes <= max_bytes
    assert (cache.entries, cache.tokens, cache.nbytes) == (3, 90, 3 * entry)
    assert propose([1, 49000, 49001], config=ANY_RECALL, cache=cache) == [49002, 49003]
    assert propose([1, 46000, 46001], config=ANY_RECALL, cache=cache) == []
    cache.add("", list(range(500)))  # longer than the whole cache holds: its last tokens that fit
    assert cache.entries == 1 and cache.tokens == (max_bytes - BYTES_PER_ENTRY) // BYTES_PER_TOKEN
    assert cache.nbytes <= max_bytes and propose([1, 498], config=ANY_RECALL, cache=cache) == [499]
    assert SuffixCache(max_entries=0, max_bytes=1 << 20).add("", [1, 2, 3]) is None
    assert SuffixCache(max_entries=8, max_bytes=BYTES_PER_ENTRY).add("", [1, 2, 3]) is None


@pytest.mark.parametrize("vocab, lengths", [(150_000, (20, 120)), (1000, (20, 120)), (20, (20, 120)), (99_000, (2, 3))])
def test_memory_stays_bounded_under_many_insertions(vocab, lengths):
    """The cache's real memory (tracemalloc) stays under what it counts (nbytes), which stays under
    its bound, however many entries come and go, in several namespaces. A large vocabulary is the worst
    case per token (nearly every anchor is new), tiny entries the worst case per entry."""
    max_bytes = 1 << 19
    rng = random.Random(2)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        cache = SuffixCache(max_entries=1000, max_bytes=max_bytes)
        mean_entry = BYTES_PER_TOKEN * sum(lengths) / 2 + BYTES_PER_ENTRY
        insertions = int(5 * max_bytes / mean_entry)  # the cache fills and turns over a few times
        for i in range(insertions):
            cache.add(f"key-{i % 3}", [rng.randrange(vocab) for _ in range(rng.randint(*lengths))])
            assert cache.nbytes <= max_bytes
            if i % (insertions // 20) == 0:  # (what the cache frees, refcounting frees at once: no cycles)
                used = tracemalloc.get_traced_memory()[0] - base
                assert used <= cache.nbytes, f"{used} bytes traced, {cache.nbytes} counted"
        assert cache.nbytes > max_bytes // 2  # full: the bound is what limits it
        spaces = list(cache._spaces.values())
        assert sum(table_sizes(s)[0] for s in spaces) == cache.tokens - sum(len(s.seqs) for s in spaces)
    finally:
        tracemalloc.stop()


def test_emptied_namespaces_are_dropped():
    cache = SuffixCache(max_entries=4, max_bytes=1 << 20)
    for i in range(50):
        cache.add(f"key-{i}", list(range(i, i + 40)))
    assert sorted(cache.namespaces()) == ["key-46", "key-47", "key-48", "key-49"]
    cache.clear()
    assert (cache.entries, cache.tokens, cache.namespaces()) == (0, 0, [])


# -- the registry and the engine --------------------------------------------------------------------

VOCAB = 40
PROMPTS = [[1, 2, 3, 4, 5], [7], [3, 9, 3, 9, 3, 9, 3]]


def run(engine, prompt, max_tokens=30, sampling=GREEDY):
    return engine.generate(prompt, sampling, StopConfig(max_tokens=max_tokens)).run()


def test_registered_as_a_model_free_proposer():
    target = random_table_backend(VOCAB, seed=0, order=2)
    factory = build_proposer(SUFFIX, SpecConfig(), target=target)
    assert isinstance(factory, SuffixFactory) and factory.vocab_size == VOCAB and factory.name == "suffix"
    assert not needs_model("suffix")
    with pytest.raises(ConfigError, match="no probabilities"):
        build_proposer(SUFFIX, SpecConfig(draft_confidence=0.4), target=target)


@pytest.mark.parametrize("k", [1, 4, 8, 15])
def test_greedy_speculative_equals_plain(k):
    target = random_table_backend(VOCAB, seed=0, order=2)
    factory = SuffixFactory(vocab_size=VOCAB)  # one factory: later prompts also draft from the cache
    for prompt in PROMPTS * 2:
        plain = run(Engine(target), prompt, max_tokens=40)
        spec = run(Engine(target, factory, SpecConfig(k=k)), prompt, max_tokens=40)
        assert spec.token_ids == plain.token_ids
        assert spec.finish_reason == plain.finish_reason == "length"
    assert factory.cache.entries == len(PROMPTS) * 2


def test_sampling_keeps_the_target_cache_at_the_committed_tokens():
    target = random_table_backend(VOCAB, seed=0, order=2)
    engine = Engine(target, SuffixFactory(), SpecConfig(k=4))
    gen = engine.generate(PROMPTS[2], SamplingParams(temperature=1.0, seed=3), StopConfig(max_tokens=40))
    for _ in gen:
        assert gen.target_sequence.tokens == (PROMPTS[2] + gen.token_ids)[:-1]  # the last token is pending
    assert gen.stats.drafted > 0 and len(gen.token_ids) == 40


def test_drafts_are_accepted_on_repetitive_text():
    period = [11, 12, 13, 14, 15, 16, 17]

    def logits_fn(prefix):  # continues the prompt's period forever
        out = torch.zeros(VOCAB)
        out[period[(len(prefix)) % len(period)]] = 10.0
        return out

    target = FunctionBackend(logits_fn, VOCAB)
    prompt = period * 2
    g = run(Engine(target, SuffixFactory(), SpecConfig(k=8)), prompt, max_tokens=60)
    assert g.token_ids == run(Engine(target), prompt, max_tokens=60).token_ids
    assert g.stats.tau > 4 and g.stats.alpha > 0.9
    assert g.stats.target_passes < 15


def test_a_repeated_request_drafts_from_the_cache():
    target = random_table_backend(200, seed=5, order=2)  # rarely repeats itself within a request
    factory = SuffixFactory()
    engine = Engine(target, factory, SpecConfig(k=8))
    prompt = [1, 2, 3, 4]
    first = run(engine, prompt, max_tokens=60)
    second = run(engine, prompt, max_tokens=60)
    assert second.token_ids == first.token_ids
    assert first.stats.tau < 1.5
    assert second.stats.tau > 3 and second.stats.target_passes < first.stats.target_passes / 2


# -- namespaces end to end, through the pipeline ------------------------------------------------------


def test_namespaces_are_kept_apart_through_the_pipeline():
    """Request A in namespace "a" teaches a continuation; B in "b", same prompt, drafts exactly as with
    an empty cache (nothing of A's), while C in "a" drafts A's output back."""

    def pipeline() -> Pipeline:
        target = SlowBackend(printable_table(0), BYTES, eos=EOS, context_length=512, name="fake-bytes")
        factory = SuffixFactory(SuffixConfig(spec_factor=4.0), vocab_size=BYTES)
        return Pipeline(target, TextCodec(ByteTokenizer()), factory, SpecConfig(k=8), draft_name=SUFFIX)

    prompt = list(b"Once upon a time")
    stop = StopConfig(max_tokens=48, ignore_eos=True)
    pipe = pipeline()
    a = pipe.generate(prompt, GREEDY, stop, namespace="a")
    b = pipe.generate(prompt, GREEDY, stop, namespace="b")
    c = pipe.generate(prompt, GREEDY, stop, namespace="a")
    fresh = pipeline().generate(prompt, GREEDY, stop, namespace="b")
    assert a.token_ids == b.token_ids == c.token_ids == fresh.token_ids  # lossless whatever is drafted
    # B drafted what a request with an empty cache drafts, step for step: nothing learnt from A
    assert (b.stats.drafted, b.stats.accepted, b.stats.target_passes) == (
        fresh.stats.drafted,
        fresh.stats.accepted,
        fresh.stats.target_passes,
    )
    assert b.stats.tau < 2  # the table rarely repeats itself: little to draft from the request alone
    assert c.stats.tau > 4 and c.stats.target_passes < b.stats.target_passes / 2  # A's output, drafted back
    assert sorted(pipe.engine.proposer.cache.namespaces()) == ["a", "b"]


def test_forget_drops_one_namespace_only():
    factory = SuffixFactory(ANY_RECALL_4)
    finish(factory, [1, 2], [70, 71, 72, 73], namespace="repeat-0")
    finish(factory, [1, 2], [80, 81, 82, 83], namespace="repeat-1")
    factory.forget("repeat-0")
    factory.forget("nobody")  # nothing to forget: no error
    assert factory.cache.namespaces() == ["repeat-1"] and factory.cache.entries == 1 and factory.cache.tokens == 4
    assert factory.create("repeat-0").propose([70, 71], 8, GREEDY, None).tokens == []
    assert factory.create("repeat-1").propose([80, 81], 8, GREEDY, None).tokens == [82, 83]


# -- the knobs a user sets: SpecConfig.suffix, --suffix-* -------------------------------------------


def test_a_suffix_draft_may_be_as_long_as_the_engine_verifies():
    """--k-max 48 (or a fixed --k 24) lets a long verbatim copy be drafted that far, not 16 tokens at most."""
    target = random_table_backend(256, seed=0, order=2)
    text = list(range(10, 130))  # 120 distinct tokens, then again: the second time, the rest is a match
    options = SuffixOptions(spec_factor=2.0)  # a 32-token match may draft 64
    for k, k_max, longest in [(None, 16, 16), (None, 48, 48), (24, 16, 24)]:
        factory = build_proposer(SUFFIX, SpecConfig(k=k, k_max=k_max, suffix=options), target=target)
        draft = factory.create().propose(text + text[:40], 64, GREEDY, None)
        assert draft.tokens == text[40 : 40 + longest], (k, k_max)


def test_user_options_reach_the_proposer():
    target = random_table_backend(VOCAB, seed=0, order=2)
    options = SuffixOptions(cache_entries=3, cache_mb=1, max_depth=8, min_token_prob=0.5, spec_factor=2.0)
    factory = build_proposer(SUFFIX, SpecConfig(suffix=options), target=target)
    c = factory.config
    assert (c.cache_entries, c.cache_bytes, c.max_depth, c.min_token_prob, c.spec_factor) == (3, 1 << 20, 8, 0.5, 2.0)
    assert (factory.cache.max_entries, factory.cache.max_bytes) == (3, 1 << 20)
    assert SuffixConfig.from_options(SuffixOptions()) == SuffixConfig()  # one set of defaults
    with pytest.raises(ConfigError, match="suffix options .* 'ngram' does not use them"):
        build_proposer("ngram", SpecConfig(suffix=SuffixOptions(cache_entries=3)), target=target)
    for kwargs, words in [
        ({"cache_entries": -1}, "--suffix-cache-entries must be an integer >= 0, got -1"),
        ({"cache_mb": -1}, "--suffix-cache-mb must be a number of MiB >= 0, got -1"),
        ({"cache_mb": True}, "--suffix-cache-mb must be a number of MiB"),
        ({"max_depth": 0}, "--suffix-max-depth must be an integer >= 1, got 0"),
        ({"min_token_prob": -0.1}, "--suffix-min-token-prob must be a probability >= 0 and <= 1"),
        ({"spec_factor": float("inf")}, "--suffix-spec-factor must be a number > 0"),
    ]:
        with pytest.raises(ConfigError, match=words):
            SpecConfig(suffix=SuffixOptions(**kwargs))


def test_suffix_flags():
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    add_suffix_options(parser)

    def spec(*argv):
        return spec_from_args(parser.parse_args(list(argv)))

    assert spec("--draft", "suffix").suffix == SuffixOptions()
    got = spec(
        "--draft",
        "suffix",
        "--suffix-cache-entries",
        "5",
        "--suffix-cache-mb",
        "1.5",
        "--suffix-max-depth",
        "12",
        "--suffix-min-token-prob",
        "0.3",
        "--suffix-spec-factor",
        "2",
    ).suffix
    assert got == SuffixOptions(cache_entries=5, cache_mb=1.5, max_depth=12, min_token_prob=0.3, spec_factor=2.0)
    assert got.cache_bytes == 3 << 19
    with pytest.raises(
        ConfigError, match="--suffix-cache-mb, --suffix-max-depth: options of --draft suffix, but --draft is 'ngram'"
    ):
        spec("--draft", "ngram", "--suffix-cache-mb", "8", "--suffix-max-depth", "4")
    with pytest.raises(ConfigError, match="--suffix-cache-mb must be a number of MiB >= 0"):
        spec("--draft", "suffix", "--suffix-cache-mb", "-1")
    with pytest.raises(ConfigError, match="--suffix-cache-entries must be an integer >= 0, got -2"):
        spec("--draft", "suffix", "--suffix-cache-entries", "-2")
