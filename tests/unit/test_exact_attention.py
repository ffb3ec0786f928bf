"""Which ways exact mode tries to run llama.cpp's attention on a build, cheapest first
(spekula.backends.llamacpp._exact_attentions; docs/decisions/0013-exact-attention-without-flash.md), and that the
setting patch 0005 reads as a context is created never stays in the environment."""

from __future__ import annotations

import os

import pytest

from spekula.backends import llamacpp
from spekula.backends.llamacpp import (
    FLASH_MIN_ROWS_PATCH,
    MATMUL_ATTENTION_PATCH,
    SPLIT_KV_PATCH,
    TILED_ATTENTION_ROWS,
    TILED_MATMUL_ROWS,
    WAY_MARGIN,
    _Attention,
    _cheapest,
    _exact_attentions,
)

Q8_0_FLASH = _Attention(flash=True, f16_k=False, prefill_min_rows=TILED_MATMUL_ROWS)


def test_the_project_s_build_tries_flash_attention_for_prompts_and_matmuls_below_first():
    ways = _exact_attentions(frozenset({SPLIT_KV_PATCH, MATMUL_ATTENTION_PATCH, FLASH_MIN_ROWS_PATCH}), 2, 12)
    assert ways == [
        _Attention(flash=True, f16_k=True, prefill_min_rows=TILED_ATTENTION_ROWS, flash_min_rows=TILED_ATTENTION_ROWS),
        _Attention(flash=False, f16_k=True, prefill_min_rows=TILED_MATMUL_ROWS),
        _Attention(flash=True, f16_k=True, prefill_min_rows=TILED_ATTENTION_ROWS),
        Q8_0_FLASH,
    ]
    assert "from 64 rows, matmuls below" in str(ways[0]) and "K in Q8_0" in str(ways[-1])


def test_each_way_needs_its_patches_and_an_unpatched_build_gets_flash_attention_with_k_in_q8_0():
    assert _exact_attentions(frozenset(), 2, 12) == [Q8_0_FLASH]
    # patch 0005 alone runs nothing: the matmuls of narrow passes sum one row otherwise without patch 0004
    assert _exact_attentions(frozenset({FLASH_MIN_ROWS_PATCH}), 2, 12) == [Q8_0_FLASH]
    assert [w.flash for w in _exact_attentions(frozenset({MATMUL_ATTENTION_PATCH}), 2, 12)] == [False, True]
    # flash attention keeps K in F16 only where one query's heads are at least the threads (patch 0003)
    assert _exact_attentions(frozenset({SPLIT_KV_PATCH}), 16, 12) == [Q8_0_FLASH]
    assert _exact_attentions(frozenset({SPLIT_KV_PATCH}), 12, 12)[0].f16_k


class _Made(Exception):
    pass


def test_the_flash_attention_width_is_set_only_while_a_context_is_created(monkeypatch):
    """LlamaCppBackend._new_context sets LLAMA_FLASH_ATTN_MIN_ROWS for llama.cpp to read, then puts back what was
    there (nothing, or the user's own value), even when creating the context fails."""
    import llama_cpp._internals as internals

    seen = []

    def fake_context(*, model, params, verbose):
        seen.append(os.environ.get(llamacpp.FLASH_MIN_ROWS_ENV))
        raise _Made

    monkeypatch.setattr(internals, "LlamaContext", fake_context)
    backend = object.__new__(llamacpp.LlamaCppBackend)
    backend.exact, backend.exact_f16_k, backend.flash_attention = True, True, True
    backend.flash_min_rows, backend.threads, backend.model = TILED_ATTENTION_ROWS, 2, None
    for before in (None, "7"):
        if before is None:
            monkeypatch.delenv(llamacpp.FLASH_MIN_ROWS_ENV, raising=False)
        else:
            monkeypatch.setenv(llamacpp.FLASH_MIN_ROWS_ENV, before)
        with pytest.raises(_Made):
            backend._new_context(256)
        assert seen[-1] == str(TILED_ATTENTION_ROWS)
        assert os.environ.get(llamacpp.FLASH_MIN_ROWS_ENV) == before


def test_a_later_way_is_taken_only_where_its_one_token_pass_costs_less_by_more_than_the_margin():
    """LlamaCppBackend._check_exact's choice between the exact ways it compared (in order of preference): which is
    cheaper follows the CPU, and a tie within WAY_MARGIN keeps the earlier."""
    assert _cheapest([0.0266]) == 0
    assert _cheapest([0.0266, 0.0236]) == 1  # the one-token passes of docs/decisions/0014's AMD EPYC
    assert _cheapest([0.0236, 0.0266]) == 0
    assert _cheapest([1.0, 1.0 - WAY_MARGIN / 2]) == 0  # within the margin
    assert _cheapest([1.0, 1.0 - 2 * WAY_MARGIN]) == 1
    assert _cheapest([1.0, float("inf")]) == 0
    assert _cheapest([1.0, 0.9, 0.89]) == 1  # measured against the way kept so far


def test_a_way_says_which_kernel_its_one_token_passes_take():
    ways = _exact_attentions(frozenset({SPLIT_KV_PATCH, MATMUL_ATTENTION_PATCH, FLASH_MIN_ROWS_PATCH}), 2, 12)
    assert [w.one_row_flash for w in ways] == [False, False, True, True]
