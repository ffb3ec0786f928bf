"""Prompt caching: a request that starts like the last finished one prefills only what differs, and the
output is what a fresh prefill gives."""

import pytest

from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.proposers import build_proposer
from spekula.prompt_cache import PromptCache, shared_prefix
from spekula.testing import random_table_backend


def test_shared_prefix():
    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([], [1]) == 0
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
