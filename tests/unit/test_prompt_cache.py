"""Prompt caching: a request that starts like the last finished one prefills only what differs, and the
output is what a fresh prefill gives."""

import pytest

from spekula.backends.base import Capabilities, pass_kind
from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.prompt_cache import PromptCache, shared_prefix
from spekula.proposers import build_proposer
from spekula.testing import FunctionBackend, KindedSequence, random_table_backend


def test_shared_prefix():
    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([], [1]) == 0
    long = list(range(300))
    for cut in (0, 1, 63, 64, 65, 128, 200, 299):  # the first difference at, before and after a block's edge
        assert shared_prefix(long, long[:cut] + [-1] + long[cut + 1 :]) == cut
        assert shared_prefix(long, long[:cut]) == cut == shared_prefix(long[:cut], long)
    assert shared_prefix(long, list(long)) == 300
    assert shared_prefix([5], [1]) == 0


def test_a_kept_sequence_is_cut_back_to_what_the_next_prompt_shares():
    backend = random_table_backend(32, seed=0)
    cache = PromptCache(backend)
    first = cache.open([1, 2, 3])
    first.forward([1, 2, 3, 4, 5])
    cache.close(first, reusable=True)
    second = cache.open([1, 2, 3, 9])
    assert second is first and second.tokens == [1, 2, 3]
    assert (cache.hits, cache.reused_tokens) == (1, 3)
    cache.close(second, reusable=True)
    third = cache.open([7, 8])  # nothing shared: the kept one is freed, a fresh one opened
    assert third is not first and third.length == 0 and first.length == 0
    assert cache.hits == 1


def test_a_failed_request_or_a_disabled_cache_keeps_nothing():
    backend = random_table_backend(32, seed=0)
    cache = PromptCache(backend)
    seq = cache.open([1, 2])
    seq.forward([1, 2])
    cache.close(seq, reusable=False)
    assert seq.length == 0 and cache.open([1, 2]) is not seq
    off = PromptCache(backend, enabled=False)
    seq = off.open([1, 2])
    seq.forward([1, 2])
    off.close(seq, reusable=True)
    assert seq.length == 0 and off.open([1, 2]).length == 0


def test_min_tokens_decides_what_is_worth_keeping():
    backend = random_table_backend(32, seed=0)
    cache = PromptCache(backend, min_tokens=3)
    seq = cache.open([])
    seq.forward([1, 2, 3, 4])
    cache.close(seq, reusable=True)
    assert cache.open([1, 2, 9]).length == 0  # 2 shared tokens: below min_tokens
    assert seq.length == 0


def test_several_kept_sequences_the_one_sharing_most_is_taken_and_the_oldest_goes_first():
    backend = random_table_backend(32, seed=0)
    cache = PromptCache(backend, max_kept=2)
    runs = {}
    for name, tokens in {"a": [1, 2, 3, 4], "b": [1, 2, 7, 7, 7], "c": [1, 2, 3, 9]}.items():
        runs[name] = cache.open([])
        runs[name].forward(tokens)
        cache.close(runs[name], reusable=True)  # a, then b, then c: a goes (max_kept 2)
    assert runs["a"].length == 0 and runs["b"].length == 5 and runs["c"].length == 4
    taken = cache.open([1, 2, 7, 7, 1])  # b shares 4, c 2
    assert taken is runs["b"] and taken.tokens == [1, 2, 7, 7] and runs["c"].length == 4
    cache.close(taken, reusable=True)
    assert cache.open([1, 2, 5]) is runs["b"]  # b and c share 2: the latest finished is taken
    cache.close(runs["b"], reusable=True)  # kept: c, b
    assert cache.open([6]) not in runs.values() and runs["c"].length == 0  # nothing of use: the oldest freed
    assert runs["b"].tokens == [1, 2]
    with pytest.raises(ValueError, match="max_kept"):
        PromptCache(backend, max_kept=0)


class PooledBackend(FunctionBackend):
    """A runtime whose sequences share cells and come from a pool of `size` (llama.cpp's shared context)."""

    capabilities = Capabilities(batching=True, shares_prefix=True)

    def __init__(self, size: int) -> None:
        table = random_table_backend(32, seed=0)
        super().__init__(table.logits_fn, table.vocab_size)
        self.size = size
        self.open_sequences: list = []

    def new_sequence(self):
        assert self.spare_sequences() > 0, "the pool is full"
        sequence = super().new_sequence()
        sequence.released = False
        sequence.release = lambda: (sequence.truncate(0), setattr(sequence, "released", True))
        self.open_sequences.append(sequence)
        return sequence

    def spare_sequences(self) -> int:
        return self.size - sum(not s.released for s in self.open_sequences)

    def share_prefix(self, source, target, length) -> bool:
        target.tokens.extend(source.tokens[target.length : length])  # the function 'model' has no cells to copy
        return True


def test_where_cells_are_shared_a_kept_sequence_is_borrowed_from_and_stays_whole():
    """A request that shares only the start of a kept conversation borrows that start into a fresh
    sequence; the conversation's cache stays whole for its own next turn. With the pool full, the
    oldest other kept sequence makes room for that (with no use for any kept one, the oldest); the
    kept sequence is taken, cut back, only when it is the only one kept."""
    backend = PooledBackend(size=3)
    cache = PromptCache(backend, max_kept=4)
    talk = cache.open([])
    talk.forward([1, 2, 3, 4, 5, 6])
    cache.close(talk, reusable=True)
    other = cache.open([1, 2, 9])
    assert other is not talk and other.length == 0 and talk.length == 6
    assert cache.borrow(other, [1, 2, 9]) == 2 and other.tokens == [1, 2] and talk.length == 6
    cache.close(other, reusable=True)  # kept: talk, other; the pool holds 2 of 3
    again = cache.open([1, 2, 3, 4, 5, 6, 7])
    assert again is not talk and cache.borrow(again, [1, 2, 3, 4, 5, 6, 7]) == 6  # the next turn borrows it all
    assert backend.spare_sequences() == 0
    unrelated = cache.open([8, 8])  # the pool is full, nothing kept is of use: the oldest kept (talk) goes
    assert talk.released and not other.released and backend.spare_sequences() == 0
    cache.close(unrelated, reusable=False)
    cache.close(again, reusable=True)
    # full pool again (other and again kept, one spare taken by a live one) and a request that shares
    # with `again`, the latest: the oldest (other) makes room, and `again` stays whole
    live = cache.open([5])
    assert backend.spare_sequences() == 0
    short = cache.open([1, 2, 3, 4, 0])
    assert short is not again and other.released and not again.released
    assert cache.borrow(short, [1, 2, 3, 4, 0]) == 4 and again.length == 6
    # `again` the only one kept, and the pool full: it is taken, cut back
    assert backend.spare_sequences() == 0
    taken = cache.open([1, 2, 3, 9])
    assert taken is again and taken.tokens == [1, 2, 3]
    cache.clear()
    assert not live.released and not short.released


class ParkingBackend(PooledBackend):
    """A pooled runtime that can park a sequence: off the pool (its slot free), its tokens kept."""

    def new_sequence(self):
        sequence = super().new_sequence()
        sequence.parked = False

        def park():
            sequence.parked = True
            self.open_sequences.remove(sequence)  # its slot is free
            return True

        def restore_into(target):
            if not sequence.parked or target.length:
                return False
            target.tokens = list(sequence.tokens)
            return True

        sequence.park, sequence.restore_into = park, restore_into
        return sequence


def test_a_kept_sequence_is_parked_and_restored_into_a_new_one():
    """Where the runtime can park, a kept sequence leaves the pool as it is kept; a request that shares part
    of it gets a new sequence holding that part (the parked copy stays for one that shares more, and is never
    borrowed from: its cells are not in the pool); one that shares all of it takes it, and the copy goes."""
    backend = ParkingBackend(size=3)
    cache = PromptCache(backend, max_kept=4)
    talk = cache.open([])
    talk.forward([1, 2, 3, 4, 5, 6])
    cache.close(talk, reusable=True)
    assert talk.parked and talk.length == 6 and backend.spare_sequences() == 3
    part = cache.open([1, 2, 9])
    assert part is not talk and part.tokens == [1, 2] and talk.parked and talk.length == 6
    assert (cache.hits, cache.restores, cache.reused_tokens) == (1, 1, 2)
    other = cache.open([1, 2, 3, 4, 0])
    assert other.tokens == [1, 2, 3, 4] and cache.restores == 2
    new = cache.open([7])  # shares nothing; it borrows from the live `other`, not the parked `talk`
    assert cache.borrow(new, [1, 2, 3, 4, 5, 6, 0]) == 4 and new.tokens == [1, 2, 3, 4]
    for live in (part, other, new):
        cache.close(live, reusable=False)
    whole = cache.open([1, 2, 3, 4, 5, 6, 7])
    assert whole.tokens == [1, 2, 3, 4, 5, 6] and talk.length == 0 and cache.restores == 3
    cache.close(whole, reusable=True)
    assert whole.parked and cache._kept == [whole]


@pytest.mark.parametrize("draft,k", [("none", 0), ("ngram", 3), ("suffix", None)])
def test_a_next_turn_prefills_only_its_new_tokens_and_decodes_as_from_scratch(draft, k):
    """Turn 2 re-sends turn 1's prompt and answer: with the cache it prefills only the new tokens, and its
    greedy output equals a fresh engine's (the function 'model' is block invariant)."""
    turn1 = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
    stop = StopConfig(max_tokens=12, ignore_eos=True)

    def engine_on(backend, cached: bool) -> Engine:
        spec = SpecConfig(k=k, prompt_cache=cached)
        return Engine(backend, build_proposer(draft, spec, target=backend), spec)

    cached_backend = random_table_backend(16, seed=3, order=2)
    engine = engine_on(cached_backend, cached=True)
    answer = engine.generate(turn1, SamplingParams(), stop).run().token_ids
    turn2 = turn1 + answer + [7, 7, 2]
    fed_before = cached_backend.tokens_fed
    second = engine.generate(turn2, SamplingParams(), stop).run()
    assert second.stats.cached_tokens >= len(turn1) - 1  # at least turn 1's prompt was not prefilled again
    assert engine.prompt_cache.hits == 1

    fresh_backend = random_table_backend(16, seed=3, order=2)
    fresh = engine_on(fresh_backend, cached=False).generate(turn2, SamplingParams(), stop).run()
    assert second.token_ids == fresh.token_ids
    assert fresh.stats.cached_tokens == 0
    assert cached_backend.tokens_fed - fed_before < fresh_backend.tokens_fed  # what the cache saved


class KindedBackend(FunctionBackend):
    """A runtime whose rows hold other bits after passes of 4 rows or more, and again of 8 or more."""

    capabilities = Capabilities(pass_kind_widths=(4, 8))

    def __init__(self) -> None:
        table = random_table_backend(32, seed=0)
        super().__init__(table.logits_fn, table.vocab_size)

    def new_sequence(self):
        return KindedSequence(self)


def test_a_kept_row_is_taken_only_where_a_fresh_prefill_would_compute_it_alike():
    """What a fresh prefill of the new prompt (its prefix and last token) computes: one pass of all its rows where it is
    narrower than the widest kind's least width (8 here), passes of at least 8 otherwise. A kept row is taken only if
    a pass of that kind computed it, and the rows left still make a pass of that kind."""
    assert [pass_kind(rows, (4, 8)) for rows in (1, 3, 4, 7, 8, 100)] == [0, 0, 1, 1, 2, 2]
    backend = KindedBackend()
    cache = PromptCache(backend)
    wide = list(range(10))
    turn1 = cache.open(wide[:-1])
    turn1.forward(wide)  # a wide prompt: 10 rows of kind 2
    for token in (20, 21, 22):  # three steps: rows of kind 0
        turn1.forward([token])
    cache.close(turn1, reusable=True)
    # the next turn re-sends all of it and more: its prompt is wide, so the steps' rows are computed again
    turn2 = cache.open([*wide, 20, 21, 22, *range(11, 23)])
    assert turn2 is turn1 and turn2.tokens == wide and list(turn2.kinds) == [2] * 10
    turn2.forward([20, 21, 22, *range(11, 23), 5])
    cache.close(turn2, reusable=True)
    # a wide prompt that shares all 10 rows but has fewer than 8 left: the rest would be a narrower pass
    assert cache.open([*wide, 30, 31, 32]).length == 13 - 8
    # a narrow prompt (kind 1: 5 rows with its last token) that shares 3 rows of a wide pass: none taken
    backend2 = KindedBackend()
    cache2 = PromptCache(backend2)
    first = cache2.open(wide[:-1])
    first.forward(wide)
    cache2.close(first, reusable=True)
    assert cache2.open([0, 1, 2, 40]).length == 0
    # narrow after narrow: 6 rows of kind 1 kept; a prompt of 7 rows (kind 1) takes them while 4 or more are left
    cache3 = PromptCache(KindedBackend())
    narrow = cache3.open([])
    narrow.forward([1, 2, 3, 4, 5, 6])
    cache3.close(narrow, reusable=True)
    assert cache3.open([1, 2, 3, 4, 5, 6]).tokens == [1, 2]
    # kind 0 (a prompt of 3 rows) takes a kept step's rows (kind 0), whatever is left
    cache4 = PromptCache(KindedBackend())
    steps = cache4.open([])
    for token in (7, 8, 9):
        steps.forward([token])
    cache4.close(steps, reusable=True)
    assert cache4.open([7, 8]).tokens == [7, 8]


def test_without_pass_kinds_every_shared_row_is_taken():
    backend = random_table_backend(32, seed=0)
    assert backend.capabilities.pass_kind_widths == () and backend.new_sequence().pass_kinds is None
    cache = PromptCache(backend)
    seq = cache.open([])
    seq.forward(list(range(10)))
    cache.close(seq, reusable=True)
    assert cache.open([*range(10), 3]).length == 10


def test_a_borrowed_prefix_keeps_to_the_same_rule():
    class SharingKinded(KindedBackend):
        capabilities = Capabilities(batching=True, shares_prefix=True, pass_kind_widths=(4, 8))

        def share_prefix(self, source, target, length) -> bool:
            target.kinds.extend(source.kinds[target.length : length])
            target.tokens.extend(source.tokens[target.length : length])
            return True

    cache = PromptCache(SharingKinded())
    running = cache.open([])
    running.forward(list(range(12)))  # a wide prompt's pass: kind 2
    running.forward([50])  # a step: kind 0
    narrow = cache.open([0, 1, 2, 60])
    assert cache.borrow(narrow, [0, 1, 2, 60]) == 0  # a narrow prompt: not rows of a wide pass
    wide = cache.open([*range(12), 50, *range(70, 80)])
    assert cache.borrow(wide, [*range(12), 50, *range(70, 80)]) == 12 and list(wide.kinds) == [2] * 12


def test_a_borrow_that_copies_over_the_sequence_s_own_rows_takes_none_of_another_kind():
    """A runtime may copy a source's rows over those the sequence holds (llama.cpp's exact mode, whose KV streams
    share no cells): then the source's first rows must be of the plan's kind too, not only the ones past the
    sequence's, or the copy would bring rows a fresh prefill computes otherwise."""

    class CopyingKinded(KindedBackend):
        capabilities = Capabilities(batching=True, shares_prefix=True, pass_kind_widths=(4, 8))

        def share_prefix(self, source, target, length) -> bool:
            target.kinds[:] = source.kinds[:length]  # every row, the target's own included
            target.tokens[:] = source.tokens[:length]
            return True

    prompt = [*range(12), 50, *range(70, 80)]  # wide: a fresh prefill computes its rows in passes of 8 or more
    cache = PromptCache(CopyingKinded())
    odd = cache.open([])
    odd.forward([0, 1, 2])  # a narrow pass: rows of kind 0
    odd.forward(list(range(3, 12)))  # a wide one: rows of kind 2, the plan's
    taker = cache.open(prompt)
    taker.forward(list(range(10)))  # its own first rows, of the plan's kind
    taker.truncate(3)
    assert cache.borrow(taker, prompt) == 0 and list(taker.kinds) == [2] * 3  # odd's rows 3-11 are not lent alone
    good = cache.open([])
    good.forward(list(range(12)))
    assert cache.borrow(taker, prompt) == 9 and list(taker.kinds) == [2] * 12


def test_prompt_cache_any_rows_takes_every_shared_row_from_the_command_line_on():
    from spekula.cli import build_parser
    from spekula.options import spec_from_args

    spec = spec_from_args(build_parser().parse_args(["serve", "--prompt-cache-any-rows"]))
    assert spec.prompt_cache_any_rows and not SpecConfig().prompt_cache_any_rows
    engine = Engine(KindedBackend(), spec=spec)
    assert engine.prompt_cache.any_rows
    cache = engine.prompt_cache
    wide = cache.open([])
    wide.forward(list(range(10)))
    cache.close(wide, reusable=True)
    assert cache.open([0, 1, 2, 40]).tokens == [0, 1, 2]  # rows of a wider pass, taken all the same
