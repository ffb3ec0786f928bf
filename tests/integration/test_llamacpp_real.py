"""The llama.cpp backend: rollback, greedy equality as target, as draft, and in mixed pairs.

Outputs are only ever compared within one target backend (llama.cpp and transformers may produce
different greedy text from the same GGUF).
"""

from __future__ import annotations

import pytest
import torch

from spekula import llamacpp_check
from spekula.backends import llamacpp_forms
from spekula.backends.base import pass_kind
from spekula.backends.llamacpp import _exact_attentions
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.pipeline import load_model
from spekula.prompt_cache import shared_prefix
from spekula.proposers import DraftModelFactory, NgramFactory, SuffixFactory

LLAMA = BackendConfig(runtime="llamacpp", threads=2)
PROMPTS = ["def quicksort(arr):\n", "The three primary colours are"]


@pytest.fixture(scope="module")
def smol_llama():
    return load_model("smollm2-135m", LLAMA)


def greedy(engine, ids, n=24):
    return engine.generate(ids, SamplingParams(), StopConfig(max_tokens=n, ignore_eos=True)).run().token_ids


def test_rollback_gives_the_logits_of_a_fresh_prefill(smol_llama):
    backend, codec = smol_llama
    ids = codec.encode("def add(a, b):\n    return")
    seq = backend.new_sequence()
    seq.forward(ids)
    seq.forward([11, 22, 33, 44])
    seq.truncate(len(ids) + 1)
    rolled = seq.forward([55, 66])
    fresh = backend.new_sequence().forward(ids + [11, 55, 66])[-2:]
    torch.testing.assert_close(rolled, fresh, atol=1e-3, rtol=1e-3)
    assert rolled.shape == (2, backend.vocab_size)


def test_logits_are_the_callers_after_later_passes(smol_llama):
    """A pass's logits are read through a view of llama.cpp's output buffer kept between passes
    (_Context.logits); what forward returns must be a copy that later passes (one row, several rows, a
    wider block that moves the buffer) leave alone, and each pass must read its own rows."""
    backend, codec = smol_llama
    seq = backend.new_sequence()
    seq.forward(codec.encode("def add(a, b):\n    return"))
    first = seq.forward([11])
    kept = first.clone()
    block = seq.forward([22, 33, 44])
    block_kept = block.clone()
    wide = seq.forward(list(range(100, 140)))
    last = seq.forward([55])
    assert torch.equal(first, kept) and torch.equal(block, block_kept)
    assert not torch.equal(first, last) and not torch.equal(block[-1], wide[-1])
    assert wide.shape == (40, backend.vocab_size)
    seq.truncate(seq.length - 1)
    assert torch.equal(seq.forward([55]), last)  # the same pass again reads the same rows


def test_llama_cpp_python_loop_reads_the_backends_weights(smol_llama):
    """bench's llama-cpp-python contender reads the weights spekula's backend loaded (reference.shared_weights):
    the same model in memory, the same greedy tokens as with its own copy and as spekula's plain decoding, and
    the model still the backend's once that Llama is gone."""
    import ctypes
    import gc

    from spekula.bench.reference import LlamaCppPythonLoop, LlamaSettings

    backend, codec = smol_llama

    def address(model_pointer) -> int:
        return ctypes.cast(model_pointer, ctypes.c_void_p).value

    settings = LlamaSettings.of(backend)
    shared = LlamaCppPythonLoop(settings, codec, model=backend.model)
    own = LlamaCppPythonLoop(settings, codec)
    assert address(shared.llama.model) == address(backend.model.model) != address(own.llama.model)
    ids = codec.encode(PROMPTS[0])
    stop = StopConfig(max_tokens=16, ignore_eos=True)
    tokens = shared.decode(ids, stop).token_ids
    assert len(tokens) == 16 and tokens == own.decode(ids, stop).token_ids == greedy(Engine(backend), ids, 16)
    shared.llama.close()
    del shared
    gc.collect()
    assert address(backend.model.model) and greedy(Engine(backend), ids, 16) == tokens


@pytest.mark.parametrize("k", [1, 4])
def test_llamacpp_target_with_llamacpp_draft_and_ngram(smol_llama, k):
    target, codec = smol_llama
    for prompt in PROMPTS:
        ids = codec.encode(prompt)
        plain = greedy(Engine(target), ids)
        assert greedy(Engine(target, DraftModelFactory(target), SpecConfig(k=k)), ids) == plain
        assert greedy(Engine(target, NgramFactory(), SpecConfig(k=k)), ids) == plain
        assert greedy(Engine(target, SuffixFactory(), SpecConfig(k=k)), ids) == plain


def test_mixed_pairs(smol_llama, smollm2):
    llama_backend, codec = smol_llama
    torch_backend, _ = smollm2
    native_backend, _ = load_model("smollm2-135m", BackendConfig(dtype="float32", runtime="native"))
    pairs = {  # target <- draft; the first is the CLI's default pairing (native target, llama.cpp draft)
        "native <- llama.cpp": (native_backend, llama_backend),
        "llama.cpp <- native": (llama_backend, native_backend),
        "transformers <- llama.cpp": (torch_backend, llama_backend),
        "llama.cpp <- transformers": (llama_backend, torch_backend),
    }
    for name, (target, draft) in pairs.items():
        for prompt in PROMPTS:
            ids = codec.encode(prompt)
            plain = greedy(Engine(target), ids)
            assert greedy(Engine(target, DraftModelFactory(draft), SpecConfig(k=4)), ids) == plain, (name, prompt)


def test_qwen_pair_on_llamacpp():
    target, codec = load_model("qwen2.5-coder-1.5b", LLAMA)
    draft, _ = load_model("qwen2.5-coder-0.5b", LLAMA)
    ids = codec.encode(PROMPTS[0])
    plain = greedy(Engine(target), ids, 32)
    spec = (
        Engine(target, DraftModelFactory(draft), SpecConfig(k=4))
        .generate(ids, SamplingParams(), StopConfig(max_tokens=32, ignore_eos=True))
        .run()
    )
    assert spec.token_ids == plain
    assert spec.stats.alpha > 0.3


def test_llamacpp_refuses_a_dtype_it_cannot_honour():
    from spekula.errors import ConfigError

    with pytest.raises(ConfigError, match="quantised types"):
        load_model("smollm2-135m", BackendConfig(runtime="llamacpp", dtype="bfloat16"))


EXACT = BackendConfig(runtime="llamacpp", threads=2, exact=True)
COPY_PROMPT = (  # the answer re-emits the prompt's lines, so n-gram and suffix drafts get accepted
    "Copy this list exactly:\n"
    + "".join(f"item {i}: the {c} box holds {i * 3} apples\n" for i, c in enumerate(["red", "blue", "green", "black"]))
    + "\nitem 0: the red"
)
# past position 255 a one-token pass reads 512 KV cells, where llama.cpp's flash attention splits the cells
# between threads for a single query (and for a single query only)
LONG_COPY_PROMPT = (
    "Copy this list exactly:\n"
    + "".join(f"item {i}: the {c} box holds {i * 3} apples\n" for i, c in enumerate(["red", "blue", "green"] * 10))
    + "\nitem 0: the red"
)


@pytest.fixture(scope="module")
def smol_exact():
    return load_model("smollm2-135m", EXACT)


@pytest.fixture(scope="module")
def qwen_exact():
    return load_model("qwen2.5-coder-0.5b", EXACT)


@pytest.mark.parametrize("prompt", [COPY_PROMPT, LONG_COPY_PROMPT], ids=["short", "past-256"])
def test_exact_mode_scores_a_block_bit_for_bit_as_single_tokens(qwen_exact, prompt):
    """The 0.5B Q4_K_M GGUF exercises every cause: repacked 4-row weight kernels, batched attention and,
    past position 255, flash attention's split-KV path for one query."""
    target, codec = qwen_exact
    assert target.capabilities.block_invariant
    assert target.capabilities.prompt_pass_apart  # a folded prompt's rows in calls of their own (_decode)
    # on the project's build K stays F16 (attention as matmuls in passes this narrow, or flash attention with the
    # split-KV patch), so past 255 the patched paths are what is checked
    assert target.exact_f16_k == _exact_attentions(llamacpp_check.installed_patches(), 2, 14)[0].f16_k
    assert target.exact_width >= 2  # exact by scoring blocks of several tokens, not one token a pass
    ids = codec.encode(prompt)
    assert (len(ids) > 300) == (prompt is LONG_COPY_PROMPT)
    single = target.new_sequence()
    first = single.forward(ids, num_logits=1)[-1]
    generated, rows = [int(first.argmax())], []
    for _ in range(20):
        rows.append(single.forward(generated[-1:])[-1])
        generated.append(int(rows[-1].argmax()))
    single.release()
    one_by_one = torch.stack(rows)
    for width in (2, 4, 9, 17):  # then one token on the KV cache the block wrote
        seq = target.new_sequence()
        seq.forward(ids, num_logits=1)
        block = seq.forward(generated[:width], num_logits=width)
        after = seq.forward(generated[width : width + 1])
        seq.release()
        assert torch.equal(block, one_by_one[:width]), width
        assert torch.equal(after[-1], one_by_one[width]), width
        # the engine's first step: the prompt and the block in one pass, logits for the last token on
        merged = target.new_sequence()
        rows_merged = merged.forward(ids + generated[:width], num_logits=width + 1)
        merged.release()
        assert torch.equal(rows_merged[0], first) and torch.equal(rows_merged[1:], one_by_one[:width]), width


def test_either_q6_K_kernel_form_gives_every_logit_the_same_bits(qwen_exact):
    """Patch 0009: the load may give any run of rows either form of the repacked Q6_K kernels (the 0.5B Q4_K_M's
    output matrix is Q6_K) because both compute the same bits: blocks of every run's widths, in the 512-bit form
    throughout and in the 256-bit one throughout, give equal logits."""
    target, codec = qwen_exact
    set_runs = llamacpp_forms.switch()
    if set_runs is None:  # a build without the 512-bit form (or the patch): the load chose nothing
        assert target.q6_K_zmm_runs is None
        return
    chosen = set_runs(-1)
    assert chosen == target.q6_K_zmm_runs  # the load left its choice set
    # the switch is the loaded library's: no second copy mapped, whose switch no pass would read
    with open("/proc/self/maps") as maps:
        assert len({line.split()[-1] for line in maps if "libggml-cpu" in line}) == 1
    ids = codec.encode(COPY_PROMPT)[:64]
    block = [(101 + 37 * i) % target.vocab_size for i in range(13)]
    logits = {}
    try:
        for runs in (7, 0):
            set_runs(runs)
            for width in (1, 2, 3, 4, 5, 8, 9, 13):
                seq = target.new_sequence()
                seq.forward(ids, num_logits=1)
                logits[runs, width] = seq.forward(block[:width], num_logits=width)
                seq.release()
    finally:
        set_runs(chosen)
    for width in (1, 2, 3, 4, 5, 8, 9, 13):
        assert torch.equal(logits[7, width], logits[0, width]), width


@pytest.mark.parametrize("k", [1, 4, 8, 15])
def test_exact_greedy_speculative_output_is_plain_decoding(smol_exact, k):
    target, codec = smol_exact
    ids = codec.encode(COPY_PROMPT)
    plain = greedy(Engine(target), ids, 40)
    for factory in (NgramFactory(), SuffixFactory()):
        spec = (
            Engine(target, factory, SpecConfig(k=k))
            .generate(ids, SamplingParams(), StopConfig(max_tokens=40, ignore_eos=True))
            .run()
        )
        assert spec.token_ids == plain, (type(factory).__name__, k)
        assert spec.stats.accepted > 0  # drafts were verified in blocks, not only single steps


def test_exact_mode_parks_a_kept_cache_and_its_context_goes_back_to_the_pool(smol_exact):
    """In exact mode every sequence has a context of its own; parking copies its KV cells to host memory and
    returns the context, so a server can keep many finished conversations (PromptCache) without a context
    each, and a later turn restored from the copy scores its next tokens bit for bit as the unparked one."""
    target, codec = smol_exact
    ids = codec.encode(LONG_COPY_PROMPT)
    kept = target.new_sequence()
    kept.prefill([])  # an empty prefill chunk (a one-token prompt) is nothing to do
    kept.prefill(ids[:-1])
    kept.forward(ids[-1:], num_logits=1)
    reference = target.new_sequence()  # built as `kept` is: the prompt's last token scored in a pass of its own
    reference.prefill(ids[:-1])
    reference.forward(ids[-1:], num_logits=1)
    expected = reference.forward([11, 22, 33])
    reference.release()
    pooled = len(target._pool)
    assert kept.park() and kept.parked and len(target._pool) == pooled + 1
    turn2 = target.new_sequence()
    assert kept.restore_into(turn2) and turn2.tokens == ids and len(target._pool) == pooled
    assert torch.equal(turn2.forward([11, 22, 33]), expected)
    for s in (kept, turn2):
        s.release()
    assert len(target._pool) == pooled + 1


def test_exact_mode_s_prompt_cache_gives_a_fresh_prefill_s_bits_whatever_came_before(qwen_exact):
    """A prompt's rows hold other bits after a pass of 64 rows or more (flash attention's tiled kernel), of 32 or more
    (ggml's tiled matmul), or a step's (Capabilities.pass_kind_widths). A short prompt that shares its start with a
    long one served before it took that start's rows from the long one's pass, and its logits then differed from a
    fresh server's (scripts/experiments/prompt_cache_history.py: another greedy text); now it computes them again.
    A long prompt still takes a long one's rows, and a narrow one a step's."""
    target, codec = qwen_exact
    widths = target.capabilities.pass_kind_widths
    assert widths and max(widths) == target.capabilities.prefill_min_rows
    long = codec.encode(LONG_COPY_PROMPT)
    short = long[:12] + codec.encode(" and then count the boxes one by one, slowly")
    longer = long[:200] + codec.encode("\nitem 99: the blue box holds nothing at all today" * 8)
    assert pass_kind(len(short), widths) == pass_kind(len(short) - 1, widths) < len(widths)  # one narrow pass
    assert len(long) > 200 and len(longer) > 201 + max(widths)

    def first(engine: Engine, ids: list[int]) -> tuple[torch.Tensor, list[int], int]:
        gen = engine.generate(ids, SamplingParams(), StopConfig(max_tokens=6, ignore_eos=True))
        gen.prefill()
        logits = gen.target_sequence.forward(ids[-1:])  # the prompt's last token, scored alone
        gen.target_sequence.truncate(len(ids) - 1)
        cached = gen.stats.cached_tokens
        return logits, gen.run().token_ids, cached

    fresh = {name: first(Engine(target), ids) for name, ids in (("short", short), ("longer", longer))}
    served = Engine(target)  # one server: the long prompt, then the others
    first(served, long)
    for name, ids in (("longer", longer), ("short", short)):  # one kept sequence: the last request's
        logits, tokens, cached = first(served, ids)
        assert torch.equal(logits, fresh[name][0]) and tokens == fresh[name][1], name
        if name == "longer":  # a wide prompt takes the wide rows it shares, all but a wide pass's worth
            assert cached == shared_prefix(long, longer) >= 200
        else:
            assert cached == 0
    # a narrow prompt takes rows of its own kind: a step's, for one of a few tokens
    steps = Engine(target)
    head = steps.generate(long[:3], SamplingParams(), StopConfig(max_tokens=4, ignore_eos=True)).run().token_ids
    again = long[:3] + head[:2]
    logits, tokens, cached = first(steps, again)
    assert cached == len(again) - 1 and pass_kind(len(again), widths) == 0
    assert torch.equal(logits, first(Engine(target), again)[0])


def test_exact_mode_s_next_turn_takes_its_last_answer_with_a_fresh_prefill_s_bits(qwen_exact):
    """The first turn's answer was decoded by steps; the chat template's markers make a fresh prefill of the next turn
    compute that answer as a step's rows too (spekula.prefill_plan), so the served engine takes the first prompt and
    the answer from its cache and the next turn's last prompt token scores bit for bit as after a fresh prefill.
    Before, the turn took the first prompt only (decision 0018)."""
    target, codec = qwen_exact
    markers = codec.turn_markers()
    assert markers is not None and codec.tokenizer.decode(list(markers.header)) == "<|im_start|>assistant\n"
    messages = [{"role": "user", "content": LONG_COPY_PROMPT}]
    first = codec.encode(messages=messages)
    served = Engine(target, markers=markers)
    stop = StopConfig(max_tokens=40, ignore_eos=True)
    answer = served.generate(first, SamplingParams(), stop).run().token_ids
    history = [*messages, {"role": "assistant", "content": codec.decode(answer)}, {"role": "user", "content": "Again."}]
    second = codec.encode(messages=history)
    kept = first + answer[:-1]  # the last answer token was emitted, never fed
    assert shared_prefix(kept, second) > len(first) + 20  # the answer re-renders as (nearly all) the same ids

    def turn(engine: Engine) -> tuple[torch.Tensor, int]:
        gen = engine.generate(second, SamplingParams(), StopConfig(max_tokens=1, ignore_eos=True))
        gen.prefill()
        logits = gen.target_sequence.forward(second[-1:])  # the prompt's last token, scored alone
        return logits, gen.stats.cached_tokens

    logits, cached = turn(served)
    assert cached == shared_prefix(kept, second)
    assert torch.equal(logits, turn(Engine(target, markers=markers))[0])
