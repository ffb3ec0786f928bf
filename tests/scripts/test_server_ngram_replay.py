"""scripts/experiments/server_ngram_replay.py: the ports of llama-server's ngram-simple and ngram-mod draft rules
do what the C++ does (cases worked by hand from common/ngram-map.cpp, common/ngram-mod.cpp and
common/speculative.cpp), and a rule replayed through spekula's engine drafts nothing at the prompt's pass, as
llama-server cannot. The script's `--live` check compares the ports with llama-server itself; docs/decisions/
0007-llama-server-ngram.md cites both."""

from __future__ import annotations

import pytest

from scriptkit import loaded

VOCAB, EOS = 64, 63


@pytest.fixture(scope="module")
def script():
    with loaded("experiments/server_ngram_replay.py") as module:
        yield module


def test_ngram_simple_copies_what_followed_the_most_recent_match(script):
    tokens = [7, 1, 2, 3, 4, 5, 9, 1, 2, 8, 8, 8, 8, 8, 8, 1]
    # pattern [1, 2] (the last token and the one just sampled): most recent at index 7, then up to m tokens
    assert script.ngram_simple_draft(tokens, 2, n=2, m=3) == [8, 8, 8]
    # an occurrence at index 0 is never used (0 means "no match" in the C++)
    assert script.ngram_simple_draft([1, 2, 3, 4, 5, 6, 7, 8, 9, 1], 2, n=2, m=3) == []


def test_ngram_simple_drafts_nothing_shorter_than_its_n_gram_nor_in_a_short_history(script):
    tokens = [0, 5, 1, 2, 3, 9, 9, 9, 9, 9, 9, 9, 1, 2]
    assert script.ngram_simple_draft(tokens, 3, n=3, m=4) == [9, 9, 9, 9]
    # only two tokens follow the most recent match of [9, 1, 2]: no draft, though an earlier one has four after it
    # (the C++ stops at the first match it finds, searching backwards)
    assert script.ngram_simple_draft([0, 9, 1, 2, 4, 4, 4, 4, 4, 9, 1, 2, 9, 1], 2, n=3, m=4) == []
    # fewer than n + m + 2 tokens of history: no lookup at all
    assert script.ngram_simple_draft([0, 1, 2, 3, 1, 2], 3, n=2, m=4) == []


def test_ngram_mod_hash_wraps_like_a_64_bit_size_t(script):
    tokens = [151643, 9, 2**31 - 1, 0]
    value = 0
    for t in tokens:
        value = (value * script.MOD_MULTIPLIER + t) % 2**64
    assert script.mod_index(tokens, 0, 4) == value % script.MOD_SIZE


def test_ngram_mod_keeps_no_key_so_a_collision_answers_for_another_n_gram(script):
    pool = script.ModPool(n=2, size=1)  # every n-gram hashes to the one entry
    pool.add([1, 2, 3], 0)
    assert pool.get([5, 6], 0) == 3
    pool.add([4, 5, 6], 0)  # last writer wins
    assert pool.get([1, 2], 0) == 6


def test_ngram_mod_chains_its_draft_and_drops_one_shorter_than_n_min(script):
    pool, slot = script.ModPool(n=2), script.ModSlot()
    script.mod_begin(pool, slot, [1, 2, 3, 4, 5, 6])  # 1 2 -> 3, 2 3 -> 4, 3 4 -> 5, 4 5 -> 6
    assert slot.i_last == 4
    assert script.mod_draft(pool, slot, [9, 1], 2, n_max=8, n_min=2) == [3, 4, 5, 6]
    assert slot.n_draft_last == 4
    assert script.mod_draft(pool, slot, [9, 3], 4, n_max=8, n_min=3) == []  # 3 4 -> 5 -> 6, then nothing: 2 < 3
    assert slot.n_draft_last == 0


def test_ngram_mod_adds_generated_n_grams_only_in_chunks(script):
    pool, slot = script.ModPool(n=2), script.ModSlot()
    history = [1, 2, 3] + [7, 8] * 20  # "7 8 -> 7" is known only once the generated tokens join the pool
    script.mod_begin(pool, slot, history[:3])
    assert slot.i_last == 1
    assert script.mod_draft(pool, slot, history[:20], history[20], n_max=2, n_min=1) == []  # 1 + 32 < 20: not yet
    assert script.mod_draft(pool, slot, history[:40], history[40], n_max=2, n_min=1) == [7, 8]  # 1 + 32 < 40
    assert slot.i_last == 38


def test_ngram_mod_resets_its_shared_pool_after_five_mostly_rejected_drafts(script):
    pool, slot = script.ModPool(n=2), script.ModSlot()
    pool.add([1, 2, 3], 0)
    for _ in range(4):
        slot.n_draft_last = 8
        script.mod_accept(pool, slot, 1)  # 1/8 < 0.25
    assert pool.entries and slot.n_low == 4
    slot.n_draft_last = 8
    script.mod_accept(pool, slot, 2)  # 2/8 = 0.25: not low, the streak ends
    assert slot.n_low == 0
    for _ in range(5):
        slot.n_draft_last = 8
        script.mod_accept(pool, slot, 0)
    assert not pool.entries and slot.n_low == 0


def test_a_rule_replayed_through_the_engine_drafts_from_the_second_pass_on(script):
    prompt = list(range(10, 30)) * 2
    request = script.ngram_replay.Request("p", "c", prompt, list(range(10, 22)))
    factory = script.ServerRuleFactory("ngram-simple", n=2, m=3)
    counted = script.run_rule(factory, [request], {1: 1.0, 4: 2.0}, (VOCAB, EOS))["p"]
    # the prompt's pass emits 10 undrafted; then [29, 10] matches at index 19: 3 drafted + the bonus, twice; then
    # the 3 tokens left allow a draft of 2
    assert (counted.passes, counted.drafted, counted.accepted) == (4, 8, 8)


def test_bad_rule_options_get_a_clear_error(script):
    assert script.parse_ints("12,48", 2, "--simple N,M") == [12, 48]
    for bad in ("12", "12,x", "0,48"):
        with pytest.raises(Exception, match="--simple N,M must be 2 comma-separated integers"):
            script.parse_ints(bad, 2, "--simple N,M")
