"""Continuous batching on llama.cpp: with BackendConfig.parallel > 1 the first `parallel` sequences are
sequence ids in one shared context, and forward_batch scores all their blocks in one llama_decode.

SmolLM2's GGUF (Q4_1, whose weights llama.cpp does not repack on these CPUs) goes through the same
matrix kernels whatever a pass's width; with flash attention in the shared context (each query row
scored alone) a batched pass then gives each sequence exactly the logits it gets alone, so these tests
compare bit for bit and greedy text for text (the tests pin llamacpp.SHARED_FLASH_ATTENTION on, as it is
by default). llama.cpp's default attention kernel in the shared context is checked to within its rounding.
"""

from __future__ import annotations

from dataclasses import replace

import llama_cpp
import pytest
import torch
from test_prefill_chunks import Log, recorded  # noqa: F401 (recorded: a fixture, the scheduler's log with chunks)

from spekula.backends import llamacpp
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.errors import ConfigError
from spekula.pipeline import Pipeline, load_model
from spekula.prompt_cache import PromptCache
from spekula.server.metrics import ServerMetrics
from spekula.server.scheduler import Finished, Scheduler

WAIT = 60.0
PROMPTS = {
    "code": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    "colours": "The three primary colours are",
    "story": "Once upon a time, in a small village,",
    "list": "1. apples\n2. pears\n3.",
}


def llama(parallel: int) -> BackendConfig:
    return BackendConfig(runtime="llamacpp", threads=2, parallel=parallel, context_length=512, exact=False)


@pytest.fixture(scope="module")
def batched():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(llamacpp, "SHARED_FLASH_ATTENTION", True)
        return load_model("smollm2-135m", llama(3))


def test_the_default_attention_kernel_agrees_to_rounding(monkeypatch):
    """Flash attention off: a sequence batched with others gets its own logits to within
    llama.cpp's rounding, and the same greedy choice at every position."""
    monkeypatch.setattr(llamacpp, "SHARED_FLASH_ATTENTION", False)
    backend, codec = load_model("smollm2-135m", llama(2))
    assert not backend.flash_attention
    ids = [codec.encode(p) for p in list(PROMPTS.values())[:2]]
    together = [backend.new_sequence() for _ in ids]
    backend.forward_batch(together, ids, [1, 1])
    stepped = backend.forward_batch(together, [[11, 22, 33], [44, 55]])
    for prompt, block, logits in zip(ids, [[11, 22, 33], [44, 55]], stepped, strict=True):
        alone = backend.new_sequence()
        assert alone.context is not backend._shared
        alone.forward(prompt, 1)
        single = alone.forward(block)
        torch.testing.assert_close(logits, single, atol=0.5, rtol=0.02)
        assert torch.equal(logits.argmax(-1), single.argmax(-1))


def test_one_pass_over_several_sequences_gives_each_its_own_logits(batched):
    backend, codec = batched
    assert backend.capabilities.batching and backend.context_length == 512
    ids = [codec.encode(p) for p in list(PROMPTS.values())[:3]]
    together = [backend.new_sequence() for _ in ids]
    assert all(s.context is backend._shared for s in together) and len({s.seq_id for s in together}) == 3
    prefill = backend.forward_batch(together, ids, [1, 1, 1])
    blocks = [[11, 22, 33], [44, 55], [66]]  # one verify step each, of different widths
    stepped = backend.forward_batch(together, blocks)
    assert [s.length for s in together] == [len(i) + len(b) for i, b in zip(ids, blocks, strict=True)]
    for prompt, block, first, logits in zip(ids, blocks, prefill, stepped, strict=True):
        alone = backend.new_sequence()  # a fourth sequence: its own context, outside the shared one
        assert alone.context is not backend._shared
        assert torch.equal(alone.forward(prompt, 1), first)
        assert torch.equal(alone.forward(block), logits)
        alone.release()
    # rolling one sequence back leaves the others' caches alone
    together[1].truncate(len(ids[1]))
    assert torch.equal(together[1].forward([44, 55]), stepped[1])
    assert torch.equal(backend.forward_batch([together[0]], [[77]])[0], _fresh(backend, ids[0] + blocks[0] + [77]))
    for s in together:
        s.release()


def _fresh(backend, ids: list[int]) -> torch.Tensor:
    seq = backend.new_sequence()
    try:
        return seq.forward(ids, 1)
    finally:
        seq.release()


def test_sequence_ids_are_recycled_and_a_released_sequence_refuses_work(batched):
    backend, _ = batched
    first = [backend.new_sequence() for _ in range(3)]
    ids = {s.seq_id for s in first}
    overflow = backend.new_sequence()  # every id is taken: a context of its own, still usable in a batch
    assert overflow.context is not backend._shared
    out = backend.forward_batch([first[0], overflow], [[5, 6], [7]], [2, 1])
    assert [o.shape[0] for o in out] == [2, 1] and overflow.length == 1
    first[2].release()
    first[2].release()  # twice is harmless: the id is freed once
    again = backend.new_sequence()
    assert again.context is backend._shared and again.seq_id == first[2].seq_id and again.length == 0
    with pytest.raises(RuntimeError, match="released"):
        first[2].forward([1])
    with pytest.raises(RuntimeError, match="released"):
        backend.forward_batch([first[2]], [[1]])
    for s in (first[0], first[1], again, overflow):
        s.release()
    assert sorted(backend._free_ids) == sorted(ids)


def test_forward_batch_refuses_what_it_cannot_run(batched):
    backend, _ = batched
    a, b = backend.new_sequence(), backend.new_sequence()
    try:
        with pytest.raises(ValueError, match="twice"):
            backend.forward_batch([a, a], [[1], [2]])
        with pytest.raises(ValueError, match="one token list"):
            backend.forward_batch([a, b], [[1]])
        with pytest.raises(ValueError, match="num_logits"):
            backend.forward_batch([a], [[1, 2]], [3])
        assert a.length == b.length == 0  # nothing ran
    finally:
        a.release()
        b.release()


def test_parallel_is_validated():
    with pytest.raises(ConfigError, match="parallel"):
        BackendConfig(parallel=0)


def test_where_batched_passes_are_not_exact_exact_mode_steps_requests_one_at_a_time(monkeypatch):
    """The load-time check that batched rows get their bits alone (LlamaCppBackend._batches_exactly) passes on this
    build (the test below relies on it); where it fails, exact mode keeps its guarantee and gives up batching."""
    config = BackendConfig(runtime="llamacpp", threads=2, exact=True, parallel=3, context_length=256)
    checked, _ = load_model("smollm2-135m", config)
    assert checked.capabilities.batching and checked._batches_exactly()
    monkeypatch.setattr(llamacpp.LlamaCppBackend, "_batches_exactly", lambda self: False)
    backend, _ = load_model("smollm2-135m", config)
    assert not backend.capabilities.batching and backend.capabilities.block_invariant
    seq = backend.new_sequence()
    assert seq.context is backend._shared and seq.forward([5, 6, 7]).shape[0] == 3


def priced(monkeypatch, flash_row: float, matmul_row: float) -> None:
    """The load-time checks report these seconds a one-token pass for a way whose one-token passes run flash
    attention's one-row kernel and for one whose run matmuls, whatever they measured (the widths stay measured)."""
    measured = llamacpp.LlamaCppBackend._widest_exact_block

    def widest(self):
        width, _ = measured(self)
        checking = llamacpp._Attention(self.flash_attention, self.exact_f16_k, 0, self.flash_min_rows)
        return width, flash_row if checking.one_row_flash else matmul_row

    monkeypatch.setattr(llamacpp.LlamaCppBackend, "_widest_exact_block", widest)


def taken(backend) -> tuple[bool, bool, int]:
    return backend.flash_attention, backend.exact_f16_k, backend.flash_min_rows


def way(attention) -> tuple[bool, bool, int]:
    return attention.flash, attention.f16_k, attention.flash_min_rows


def test_exact_mode_takes_the_way_whose_one_token_pass_its_checks_timed_cheaper_and_falls_back_where_they_fail(
    monkeypatch,
):
    """On the project's build exact mode checks the first way of `_exact_attentions` (flash attention from 64 rows,
    matmuls below) and the first after it whose one-token passes run flash attention's one-row kernel (flash attention,
    K in F16), and takes the one whose one-token pass cost less in its checks, the later only by more than WAY_MARGIN
    (docs/decisions/0014-attention-way-by-measurement.md); the contexts open are the taken way's, also where the way
    compared failed its checks after the first passed. Where a way's prompt passes are not chunk invariant
    (LlamaCppBackend._prefills_in_any_chunks), the next is compared; where none is,
    flash attention with K in Q8_0 and prompts in passes of 32 rows or more, still exact and batching (docs/decisions/
    0012-prefill-chunks.md)."""
    from spekula import llamacpp_check

    monkeypatch.setattr(llamacpp._WayRecord, "of", classmethod(lambda cls, gguf, threads: None))  # every load measures
    config = BackendConfig(runtime="llamacpp", threads=2, exact=True, parallel=3, context_length=256)
    ways = llamacpp._exact_attentions(llamacpp_check.installed_patches(), 2, 9)  # SmolLM2-135M: 9 heads
    checked, _ = load_model("smollm2-135m", config)  # as measured on this machine
    assert checked.exact_width == llamacpp.EXACT_WIDTHS[0] and checked.capabilities.batching
    assert checked.attention is not None and taken(checked) == way(checked.attention)
    assert checked.capabilities.prefill_min_rows == checked.attention.prefill_min_rows
    seconds = list(checked.one_token_seconds.values())
    assert len(seconds) == (2 if len(ways) > 2 else 1) and all(s > 0 for s in seconds)
    assert str(checked.attention) == list(checked.one_token_seconds)[llamacpp._cheapest(seconds)]
    if len(ways) > 2:  # the project's build: the first way against flash attention with K in F16
        first, flash = ways[0], ways[2]
        assert not first.one_row_flash and flash.one_row_flash and flash.f16_k
        for flash_row, expected in ((1.0, flash), (2.0, first), (1.01, first)):  # 1.01: within the margin
            priced(monkeypatch, flash_row=flash_row, matmul_row=1.03)
            backend, _ = load_model("smollm2-135m", config)
            assert taken(backend) == way(expected) and backend.attention == expected
            assert backend.capabilities.prefill_min_rows == expected.prefill_min_rows
            assert backend.exact_width == llamacpp.EXACT_WIDTHS[0] and backend.capabilities.batching
            seq = backend.new_sequence()
            assert seq.context is backend._shared and seq.forward([5, 6, 7]).shape[0] == 3

        def all_but_flash(self, rows: int) -> bool:  # the way compared is not exact: the first's contexts again
            return (self.flash_attention, self.flash_min_rows) != (flash.flash, flash.flash_min_rows)

        priced(monkeypatch, flash_row=1.0, matmul_row=2.0)
        monkeypatch.setattr(llamacpp.LlamaCppBackend, "_prefills_in_any_chunks", all_but_flash)
        backend, _ = load_model("smollm2-135m", config)
        assert taken(backend) == way(first) and backend.attention == first and len(backend.one_token_seconds) == 1
        assert backend.exact_width == llamacpp.EXACT_WIDTHS[0] and backend.capabilities.batching
        second = ways[1]

        def all_but_the_first(self, rows: int) -> bool:
            return (self.flash_attention, self.flash_min_rows) != (first.flash, first.flash_min_rows)

        priced(monkeypatch, flash_row=2.0, matmul_row=1.0)
        monkeypatch.setattr(llamacpp.LlamaCppBackend, "_prefills_in_any_chunks", all_but_the_first)
        backend, _ = load_model("smollm2-135m", config)  # matmuls everywhere, then the same comparison
        assert taken(backend) == way(second) and backend.capabilities.prefill_min_rows == second.prefill_min_rows
        assert backend.capabilities.batching
    monkeypatch.setattr(llamacpp.LlamaCppBackend, "_prefills_in_any_chunks", lambda self, rows: False)
    backend, _ = load_model("smollm2-135m", config)
    caps = backend.capabilities
    assert backend.flash_attention and not backend.exact_f16_k and not backend.flash_min_rows
    assert caps.prefill_min_rows == llamacpp.TILED_MATMUL_ROWS
    assert caps.block_invariant and caps.batching and backend.exact_width == checked.exact_width
    seq = backend.new_sequence()
    assert seq.context is backend._shared and seq.forward([5, 6, 7]).shape[0] == 3


def test_exact_mode_records_the_way_it_chose_and_a_later_load_takes_it_where_it_is_still_exact(monkeypatch, tmp_path):
    """Where exact mode chose its attention way by measurement, it records the choice (llamacpp._WayRecord, keyed by
    the GGUF file, the library files, the CPU and the threads), and a later load takes the recorded way, whatever its
    own timings would say, once its checks find it exact: a restart computes the same bits. SPEKULA_MEASURE_WAYS=1
    measures again and records the new choice; a recorded way that is not exact is measured against the others again
    (docs/decisions/0020-prefetch-spread-and-recorded-ways.md)."""
    from spekula import llamacpp_check

    path = tmp_path / "ways" / "way.json"
    monkeypatch.setattr(llamacpp._WayRecord, "of", classmethod(lambda cls, gguf, threads: cls(path)))
    config = BackendConfig(runtime="llamacpp", threads=2, exact=True, context_length=256)
    ways = llamacpp._exact_attentions(llamacpp_check.installed_patches(), 2, 9)  # SmolLM2-135M: 9 heads
    assert len(ways) > 2  # the project's build: the first way, compared with flash attention with K in F16
    first, flash = ways[0], ways[2]
    priced(monkeypatch, flash_row=1.0, matmul_row=2.0)
    measured, _ = load_model("smollm2-135m", config)
    assert taken(measured) == way(flash) and len(measured.one_token_seconds) == 2
    assert llamacpp._WayRecord(path).read(ways) == (flash, measured.one_token_seconds)
    priced(monkeypatch, flash_row=2.0, matmul_row=1.0)  # a load that measured would take the first way now
    checks: list[tuple[bool, int]] = []
    chunked = llamacpp.LlamaCppBackend._prefills_in_any_chunks

    def logged(self, rows: int) -> bool:
        checks.append((self.flash_attention, self.flash_min_rows))
        return chunked(self, rows)

    monkeypatch.setattr(llamacpp.LlamaCppBackend, "_prefills_in_any_chunks", logged)
    again, _ = load_model("smollm2-135m", config)
    assert taken(again) == way(flash) and again.one_token_seconds == measured.one_token_seconds
    assert checks == [(flash.flash, flash.flash_min_rows)]  # the recorded way's checks alone
    assert again.exact_width == llamacpp.EXACT_WIDTHS[0] and again.capabilities.block_invariant
    prompt = [5, 6, 7, 8, 9]
    assert torch.equal(measured.new_sequence().forward(prompt), again.new_sequence().forward(prompt))
    monkeypatch.setenv(llamacpp.MEASURE_WAYS_ENV, "1")
    remeasured, _ = load_model("smollm2-135m", config)
    assert taken(remeasured) == way(first) and llamacpp._WayRecord(path).read(ways) is None  # the variable: measure
    monkeypatch.delenv(llamacpp.MEASURE_WAYS_ENV)
    assert llamacpp._WayRecord(path).read(ways) == (first, remeasured.one_token_seconds)
    llamacpp._WayRecord(path).write(flash, remeasured.one_token_seconds)  # recorded, but (below) no longer exact
    priced(monkeypatch, flash_row=1.0, matmul_row=2.0)
    monkeypatch.setattr(  # flash attention with K in F16 fails its checks: measured again, the first way is taken
        llamacpp.LlamaCppBackend, "_prefills_in_any_chunks", lambda self, rows: taken(self) != way(flash)
    )
    fallen, _ = load_model("smollm2-135m", config)
    assert taken(fallen) == way(first) and len(fallen.one_token_seconds) == 1
    assert llamacpp._WayRecord(path).read(ways)[0] == flash  # a choice with nothing compared is not recorded
    path.write_text("{not json")
    assert llamacpp._WayRecord(path).read(ways) is None


@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_exact_mode_batches_steps_and_every_row_gets_the_bits_it_gets_alone(model):
    """Exact mode with parallel > 1: one shared context with a KV stream per sequence. Steps of four sequences
    (1 to 4 rows each, some rolled back as rejected drafts are, the first with the prompt's last tokens folded in)
    go through one llama_decode each, and every row's logits equal, bit for bit, what the same sequence gets alone
    in a context of its own (a solo exact backend). On Qwen's Q4_K_M the weights take llama.cpp's repacked kernels.
    (In one cell pool, kv_unified, the rollbacks put a sequence's cells out of position order and some rows differ:
    docs/decisions/0011-exact-batching.md.)"""
    import random

    config = BackendConfig(runtime="llamacpp", threads=2, exact=True, parallel=4, context_length=512)
    with pytest.MonkeyPatch.context() as first_way:
        # Two loads time their attention ways apart (decision 0014), and where two ways cost about the same (an AMD
        # EPYC Zen 4: 35-40 ms each) they can take different ones, whose rows hold other bits: both take the first
        # exact way here, so that the batched and the lone sequence differ only in the batching.
        first_way.setattr(llamacpp, "_cheapest", lambda seconds, margin=0.0: 0)
        first_way.setattr(llamacpp._WayRecord, "of", classmethod(lambda cls, gguf, threads: None))  # nor recorded
        backend, _ = load_model(model, config)
        solo, _ = load_model(model, BackendConfig(runtime="llamacpp", threads=2, exact=True, context_length=512))
    assert solo.attention == backend.attention
    caps = backend.capabilities
    assert caps.batching and caps.block_invariant and caps.prefill_alone and caps.shares_prefix  # by copying
    assert backend._shared is not None and backend.exact_width >= 15
    rng, vocab = random.Random(0), backend.vocab_size
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(n)] for n in (40, 75, 130, 210)]
    rounds = [[(rng.randint(1, 4), rng.randint(0, 3) if r % 3 == 2 else 0) for _ in prompts] for r in range(12)]
    stream = [[rng.randrange(100, vocab - 100) for _ in range(200)] for _ in prompts]

    def replay(sequences: dict, forward) -> dict:
        """Prefill each prompt but its last 10 tokens, fold those into the first step, then the rounds; per
        sequence, its logits at every round."""
        for i, seq in sequences.items():
            seq.prefill(prompts[i][:-10])
        out, used = {i: [] for i in sequences}, dict.fromkeys(sequences, 0)
        for r, plan in enumerate(rounds):
            blocks, wanted = {}, {}
            for i in sequences:
                n = plan[i][0]
                blocks[i] = (prompts[i][-10:] if r == 0 else []) + stream[i][used[i] : used[i] + n]
                wanted[i], used[i] = n, used[i] + n
            for i, logits in forward(blocks, wanted).items():
                out[i].append(logits)
            for i, seq in sequences.items():
                n, back = plan[i]
                if back:
                    seq.truncate(seq.length - min(back, n))
                    used[i] -= min(back, n)
        return out

    together = {i: backend.new_sequence() for i in range(len(prompts))}
    assert all(seq.context is backend._shared for seq in together.values())

    def forward_batch(blocks, wanted):
        order = list(blocks)
        got = backend.forward_batch(
            [together[i] for i in order], [blocks[i] for i in order], [wanted[i] for i in order]
        )
        return dict(zip(order, got, strict=True))

    calls = []
    decode = backend._shared.ctx.decode
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend._shared.ctx, "decode", lambda batch: calls.append(batch.batch.n_tokens) or decode(batch))
        batched = replay(together, forward_batch)
    # four prefills, then the first step: each prompt's folded tail and its first scored row (the prompt's last token)
    # in a call of its own, then every other row in one; then every step is one call of all four sequences' rows
    steps = [sum(n for n, _ in plan) - (len(prompts) if r == 0 else 0) for r, plan in enumerate(rounds)]
    assert calls[4:8] == [11] * 4 and calls[8:] == [rows for rows in steps if rows]
    for i in range(len(prompts)):
        alone = solo.new_sequence()
        mine = replay(
            {i: alone}, lambda blocks, wanted, alone=alone: {j: alone.forward(b, wanted[j]) for j, b in blocks.items()}
        )
        assert all(torch.equal(a, b) for a, b in zip(mine[i], batched[i], strict=True)), f"sequence {i}"
        alone.release()


def test_in_exact_mode_a_sequence_takes_a_copy_of_another_s_cells_and_every_row_keeps_its_bits():
    """llama.cpp cannot tag one KV stream's cells with another's sequence id (it aborts), so exact mode's
    share_prefix copies them (llama_state_seq_get_data / _set_data), the target's own rows included, and cuts
    the copy where asked: the target's next rows then get the bits a sequence that prefilled the same way gets,
    and the source, left as it was, goes on as if nothing happened."""
    import random

    config = BackendConfig(runtime="llamacpp", threads=2, exact=True, parallel=3, context_length=512)
    backend, _ = load_model("smollm2-135m", config)
    rng, vocab = random.Random(1), backend.vocab_size
    prompt, step, block = ([rng.randrange(100, vocab - 100) for _ in range(n)] for n in (70, 3, 5))

    def fresh(*chunks: list[int]) -> torch.Tensor:
        """The logits of the last chunk's rows, for a sequence that prefilled the first and ran the others."""
        seq = backend.new_sequence()
        try:
            seq.prefill(chunks[0])
            for ids in chunks[1:-1]:
                seq.forward(ids)
            return seq.forward(chunks[-1])
        finally:
            seq.release()

    source, target = backend.new_sequence(), backend.new_sequence()
    source.prefill(prompt)
    source.forward(step)  # a step's rows past the prompt: not copied
    target.prefill(prompt[:20])
    assert not backend.share_prefix(source, target, source.length + 1)  # more than the source holds
    assert backend.share_prefix(source, target, len(prompt))
    assert target.tokens == prompt and list(target.pass_kinds) == list(source.pass_kinds)[: len(prompt)]
    assert source.tokens == prompt + step
    assert torch.equal(target.forward(block), fresh(prompt, block))
    assert torch.equal(source.forward(block), fresh(prompt, step, block))
    other = backend.new_sequence()
    other.prefill(prompt[:5] + block)  # not a prefix of the source's tokens: nothing to copy
    assert not backend.share_prefix(source, other, 10) and other.tokens == prompt[:5] + block
    for seq in (source, target, other):
        seq.release()


def _counting_scheduler(pipe: Pipeline) -> tuple[Scheduler, list[int]]:
    """A scheduler of up to four running requests over pipe, and the sequences in each of its target's batched
    forwards, as they happen."""
    calls: list[int] = []
    forward_batch = pipe.target.forward_batch

    def counted(sequences, *args, **kwargs):
        calls.append(len(sequences))
        return forward_batch(sequences, *args, **kwargs)

    pipe.target.forward_batch = counted
    return Scheduler(pipe, ServerMetrics(), max_running=4, max_queue=8, prefill_chunk=64), calls


@pytest.mark.parametrize("k", [0, 3, None])
def test_the_server_batches_concurrent_requests_on_llamacpp(k):
    """Four greedy requests at once through the scheduler (plain, suffix drafting with k = 3, and --k
    auto): the target's passes carry all four requests, and each finishes with its tokens. Plain and
    fixed-k runs give every text plain decoding gives alone (deterministic rounds; with --k auto the
    rounds follow measured times, and a rollback may leave a sequence's later cells out of position
    order in the shared pool, which changes attention's summation order: not bitwise, so only checked
    to finish)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(llamacpp, "SHARED_FLASH_ATTENTION", True)
        pipe = Pipeline.load("smollm2-135m", "suffix", SpecConfig(k=k), llama(5))
    scheduler, calls = _counting_scheduler(pipe)
    assert scheduler.batching
    log = Log(scheduler)
    ids = {name: pipe.codec.encode(prompt) for name, prompt in PROMPTS.items()}
    for name, prompt_ids in ids.items():
        scheduler.submit(log.job(name, prompt_ids, 24))
    log.run()
    assert calls.count(4) >= 2  # the prefill and decode steps of all four, each in one pass
    drafted = 0
    for name, prompt_ids in ids.items():
        finished = log.of(name)[-1][1]
        assert isinstance(finished, Finished) and finished.stats.output_tokens == 24, name
        drafted += finished.stats.drafted
        if k is not None:
            stop = StopConfig(max_tokens=24, ignore_eos=True)
            assert log.text(name) == pipe.generate(prompt_ids, SamplingParams(), stop, plain=True).text, name
    if k is not None:  # k = 3 drafts from the prompts' own text; plain never (--k auto: as the costs say)
        assert (drafted > 0) == (k == 3)


@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_in_exact_mode_the_server_batches_steps_and_every_text_is_plain_decoding_s(model):
    """Exact mode (the default) with four greedy requests at once and --k auto: the steps of all four go through
    one pass, and every text is the one plain decoding of the same target gives alone, bit for bit, whatever the
    rounds and the drafts were."""
    config = BackendConfig(runtime="llamacpp", threads=2, parallel=5, context_length=512, exact=True)
    scheduler, calls = _counting_scheduler(Pipeline.load(model, "suffix", SpecConfig(k=None), config))
    pipe = scheduler.pipeline
    assert scheduler.batching and not scheduler._batch_prefill
    log = Log(scheduler)
    prompts = {**PROMPTS, "list": PROMPTS["code"] + "    return a - b\n\ndef mul(a, b):\n"}  # the code prompt's start
    ids = {name: pipe.codec.encode(prompt) for name, prompt in prompts.items()}
    for name, prompt_ids in ids.items():
        scheduler.submit(log.job(name, prompt_ids, 32))
    log.run()
    assert calls.count(4) >= 10  # the steps of all four, each in one pass
    stop = StopConfig(max_tokens=32, ignore_eos=True)
    for name, prompt_ids in ids.items():
        finished = log.of(name)[-1][1]
        assert isinstance(finished, Finished) and finished.stats.output_tokens == 32, name
        assert log.text(name) == pipe.generate(prompt_ids, SamplingParams(), stop, plain=True).text, name


def test_a_sequence_shares_another_s_prefix_without_computing_it(batched):
    """share_prefix tags the source's cells with the target's sequence id: the target then scores its next
    tokens exactly as after prefilling the prefix itself, and keeps the cells when the source is gone."""
    backend, codec = batched
    ids = codec.encode(PROMPTS["code"])
    source, target = backend.new_sequence(), backend.new_sequence()
    source.forward(ids + [11, 22], 1)
    assert backend.share_prefix(source, target, len(ids))
    assert target.tokens == ids and source.length == len(ids) + 2
    assert not backend.share_prefix(source, target, len(ids))  # nothing further to share
    source.release()  # the cells stay the target's
    assert torch.equal(target.forward([33, 44]), _fresh_block(backend, ids, [33, 44]))
    others = [backend.new_sequence() for _ in range(3)]  # the two free ids, then a context of its own
    assert others[2].context is not backend._shared and not backend.share_prefix(target, others[2], 3)
    for s in (target, *others):
        s.release()


def _fresh_block(backend, prefix: list[int], block: list[int]) -> torch.Tensor:
    seq = backend.new_sequence()
    try:
        seq.forward(prefix, 1)
        return seq.forward(block)
    finally:
        seq.release()


@pytest.mark.parametrize("exact", [False, True])
def test_a_request_borrows_the_prompt_a_running_request_prefilled(recorded, exact):  # noqa: F811
    """An edit session's second turn arrives with the first: the first (fewer tokens left) is prefilled
    first, and the second's chunks then share its cells instead of computing them again (exact mode: copy them
    into its own KV stream); both texts are those of plain decoding alone, and the second reports the borrowed
    tokens as cached."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(llamacpp, "SHARED_FLASH_ATTENTION", True)
        pipe = Pipeline.load("smollm2-135m", "none", SpecConfig(k=0), replace(llama(3), exact=exact))
    log = recorded(pipe, max_running=2, prefill_chunk=32)
    scheduler = log.scheduler
    first = pipe.codec.encode(PROMPTS["code"] * 3)
    # a tail of 64 rows or more: in exact mode a fresh prefill computes it in a pass of that kind, so every
    # shared row is one it may take (PrefillPlan.reusable)
    second = first + pipe.codec.encode(" and then the next part of the answer, one line after another" * 8)
    assert len(second) - len(first) >= 64
    scheduler.submit(log.job("first", first, 8))
    scheduler.submit(log.job("second", second, 8))
    log.run()
    stop = StopConfig(max_tokens=8, ignore_eos=True)
    for name, ids in (("first", first), ("second", second)):
        assert log.text(name) == pipe.generate(ids, SamplingParams(), stop, plain=True).text, name
    (_, done_first), (_, done_second) = log.of("first")[-1], log.of("second")[-1]
    assert done_first.stats.cached_tokens == 0
    assert done_second.stats.cached_tokens >= len(first) - 1  # it waited for the first's chunks (Scheduler._awaits)
    assert sum(n for _, n in log.chunks_of("second")) <= len(second) - len(first)  # and computed none of it again


def test_requests_that_arrive_together_with_one_system_prompt_prefill_it_once(recorded):  # noqa: F811
    """Three requests with the same long system prompt and different questions, arriving at once: the
    first prefills the common part, the others wait for it, borrow it, and prefill only their own
    question; each text is that of plain decoding alone. (Where a prompt is cut into passes moves
    llama.cpp's logits by up to ~1.5 on this model, so the questions are ones whose continuations are
    far from a near-tie; test_divergence_real covers the near-ties.)"""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(llamacpp, "SHARED_FLASH_ATTENTION", True)
        pipe = Pipeline.load("smollm2-135m", "none", SpecConfig(k=0), llama(4))
    log = recorded(pipe, max_running=3, prefill_chunk=256)  # every prompt fits in one round's budget
    scheduler = log.scheduler
    system = pipe.codec.encode("You are a careful assistant. " + PROMPTS["code"] * 4)
    questions = {"story": PROMPTS["story"], "count": " 1, 2, 3, 4, 5, 6,", "days": " Monday, Tuesday, Wednesday,"}
    prompts = {name: system + pipe.codec.encode(text) for name, text in questions.items()}
    for name, ids in prompts.items():
        scheduler.submit(log.job(name, ids, 5))
    log.run()

    stop = StopConfig(max_tokens=5, ignore_eos=True)
    prefilled = sum(n for _, _, n in log.chunks)
    assert prefilled <= len(system) + sum(len(ids) - len(system) for ids in prompts.values())  # the system prompt once
    for name, ids in prompts.items():
        assert log.text(name) == pipe.generate(ids, SamplingParams(), stop, plain=True).text, name
    cached = sorted(log.of(name)[-1][1].stats.cached_tokens for name in prompts)
    assert cached[0] == 0 and all(c >= len(system) - 1 for c in cached[1:])


def test_a_kept_cache_is_parked_off_the_shared_context_and_restored_for_the_next_turn(batched):
    """A finished request's sequence, kept by the prompt cache, leaves the shared context (its cells and
    id freed, so the requests running on do not read past them) for host memory; the next turn gets a
    new sequence holding it again, and scores its next tokens exactly as after prefilling them itself.
    A request that shares only part of it gets that part and leaves the parked copy whole."""
    backend, codec = batched
    ids = codec.encode(PROMPTS["story"])
    cache = PromptCache(backend, max_kept=3)
    turn1 = cache.open(ids[:-1])
    turn1.forward(ids + [11, 22], 1)
    cache.close(turn1, reusable=True)
    assert turn1.parked and turn1.tokens == ids + [11, 22] and backend.spare_sequences() == 3
    assert llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(backend._shared.ctx.ctx), turn1.seq_id) == -1
    with pytest.raises(RuntimeError, match="parked"):
        turn1.forward([5])
    part = cache.open(ids[:4] + [99])  # shares 4 tokens: the copy stays whole for a request that shares more
    assert part.tokens == ids[:4] and part.context is backend._shared and turn1.parked and cache.restores == 1
    assert torch.equal(part.forward([33, 44]), _fresh_block(backend, ids[:4], [33, 44]))
    turn2 = cache.open(ids + [11, 22, 7])  # holds it all: the parked copy is dropped
    assert turn2.tokens == ids + [11, 22] and turn1.released and cache.restores == 2
    assert torch.equal(turn2.forward([33, 44]), _fresh_block(backend, ids + [11, 22], [33, 44]))
    for s in (part, turn2):
        cache.close(s, reusable=False)
    assert backend.spare_sequences() == 3
