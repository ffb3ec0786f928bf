"""A prompt's prefill plan: which rows a fresh prefill computes as a step's (the assistant's messages in its history),
so that a conversation's next turn takes its last answer's rows from the prompt cache and still gets a fresh
prefill's bits (spekula.prefill_plan)."""

import pytest
import torch

from spekula.backends.base import Capabilities, pass_kind
from spekula.config import SamplingParams, StopConfig
from spekula.engine import Engine
from spekula.prefill_plan import PrefillPlan, TurnMarkers
from spekula.testing import FunctionBackend, KindedSequence, random_table_backend
from spekula.text import TextCodec

IM_START, IM_END, EOS = 300, 301, 302


class ChatTokenizer:
    """Bytes, and a ChatML template (Qwen's) with two special tokens."""

    chat_template = "chatml"
    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, return_dict=False):
        ids: list[int] = []
        for m in messages:
            ids += [IM_START, *self.encode(f"{m['role']}\n{m['content']}"), IM_END, *self.encode("\n")]
        return ids + ([IM_START, *self.encode("assistant\n")] if add_generation_prompt else [])


HEADER = (IM_START, *b"assistant\n")


def test_markers_come_from_the_chat_template():
    markers = TextCodec(ChatTokenizer()).turn_markers()
    assert markers == TurnMarkers(HEADER, frozenset({IM_END, EOS}))

    class NoGenerationPrompt(ChatTokenizer):  # a template that adds nothing for the answer: no markers
        def apply_chat_template(self, messages, add_generation_prompt=False, **kw):
            return super().apply_chat_template(messages, False)

    class Refuses(ChatTokenizer):
        def apply_chat_template(self, messages, **kw):
            raise ValueError("conversation roles must alternate")

    class Plain(ChatTokenizer):
        chat_template = None

    for tokenizer in (NoGenerationPrompt(), Refuses(), Plain()):
        assert TextCodec(tokenizer).turn_markers() is None


def test_spans_are_the_closed_assistant_messages():
    markers = TurnMarkers(HEADER, frozenset({IM_END}))
    chat = ChatTokenizer()
    ids = chat.apply_chat_template(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "say assistant\n"},  # the header's text without its special token
            {"role": "assistant", "content": "one"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": ""},  # an empty message: no rows
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "two"},
        ],
        add_generation_prompt=True,
    )
    spans = markers.spans(ids)
    assert [bytes(ids[s:e]) for s, e in spans] == [b"one", b"two"]
    assert all(ids[e] == IM_END and tuple(ids[s - len(HEADER) : s]) == HEADER for s, e in spans)
    # a prompt that ends inside the assistant's text (a continuation) does not make that text a span
    assert markers.spans([*HEADER, *b"unfinished"]) == []
    assert markers.spans([1, 2, 3]) == [] and markers.spans([]) == []
    with pytest.raises(ValueError):
        TurnMarkers((), frozenset({IM_END}))


def test_a_plan_chunks_segment_by_segment():
    plan = PrefillPlan(length=100, narrow=((30, 50),), widths=(18, 32, 64), least=8)
    assert [plan.segment(p) for p in (0, 29, 30, 49, 50, 99)] == [
        (0, 30, False),
        (0, 30, False),
        (30, 50, True),
        (30, 50, True),
        (50, 100, False),
        (50, 100, False),
    ]
    assert plan.chunk(0, None) == (30, False)  # never across a segment's edge
    assert plan.chunk(0, 25) == (30, False)  # a wide segment's chunk leaves none or at least `least` rows
    assert plan.chunk(0, 10) == (10, False) and plan.chunk(0, 3) == (8, False)
    assert plan.chunk(30, 5) == (35, True) and plan.chunk(45, None) == (50, True)  # narrow: any cut
    assert plan.chunk(50, None) == (100, False)
    # kinds: a narrow segment's are a step's; a wide one's its width's, the last with the prompt's last token
    assert [plan.kind(p) for p in (0, 30, 50)] == [pass_kind(30, (18, 32, 64)), 0, pass_kind(51, (18, 32, 64))]
    assert PrefillPlan.of(list(range(10)), (), 1, TurnMarkers(HEADER, frozenset({IM_END}))).narrow == ()


def test_reusable_takes_whole_segments_and_leaves_a_wide_one_a_pass_of_its_kind():
    widths = (4, 8)
    plan = PrefillPlan(length=30, narrow=((10, 15),), widths=widths, least=8)
    kinds = [2] * 10 + [0] * 5 + [2] * 15
    assert plan.kind(0) == 2 and plan.kind(10) == 0 and plan.kind(15) == 2  # 10 rows; 15 + the last token
    assert plan.reusable(kinds, shared=30) == 30 - 8  # the last segment keeps a wide pass's worth
    assert plan.reusable(kinds, shared=13) == 13  # ends inside the answer: its rest is a step's rows anyway
    assert plan.reusable(kinds, shared=7) == 2  # 3 rows left of a 10-row segment would be a narrower pass: 8 are
    assert plan.reusable(kinds, shared=16) == 16  # one row into the last segment, 14 left: a wide pass still
    assert plan.reusable([2] * 10 + [0] * 5 + [0] * 15, shared=30) == 15  # the last segment's rows of a step's kind
    assert plan.reusable([2] * 30, shared=30) == 10  # the answer's rows from a wide pass: not taken
    # without narrow spans: the rule of decision 0018 (one wide segment, the prompt's last token in it)
    whole = PrefillPlan(length=20, narrow=(), widths=widths, least=8)
    assert whole.reusable([2] * 20, shared=20) == 12 and whole.reusable([2] * 20, shared=9) == 9
    assert whole.reusable([0] * 20, shared=20) == 0
    short = PrefillPlan(length=2, narrow=(), widths=widths, least=8)  # 3 rows: a step's kind, any rows left
    assert short.reusable([0, 0], shared=2) == 2


class LeaningSequence(KindedSequence):
    """Rows whose bits depend on the kind of pass that computed them, as in llama.cpp's exact mode: each row's logits
    lean towards a letter chosen by the kinds of every row up to it, so a row of another kind changes the text. A
    narrow prefill runs as a step's passes."""

    def prefill(self, token_ids, narrow=False):
        if not narrow:
            return super().prefill(token_ids)
        for start in range(0, len(token_ids), 3):  # passes narrower than the first kind's width
            self.forward(token_ids[start : start + 3], num_logits=1)

    def _forward(self, token_ids, num_logits):
        logits = super()._forward(token_ids, num_logits)
        for row in range(num_logits):
            held = len(self.kinds) - num_logits + row + 1
            logits[row, 97 + (sum(k * (i + 1) for i, k in enumerate(self.kinds[:held])) % 26)] += 2.0
        return logits


class KindedBackend(FunctionBackend):
    """Letters only, as a random bigram table picks them; rows of other bits past 4 and 8 rows a pass."""

    capabilities = Capabilities(pass_kind_widths=(4, 8), prefill_min_rows=8)

    def __init__(self) -> None:
        table = random_table_backend(IM_START, seed=5, order=2)
        letters = torch.full((EOS + 1,), -1e9)
        letters[97:123] = 0.0

        def logits_fn(prefix):
            return letters + torch.cat([table.logits_fn([t % IM_START for t in prefix]), torch.zeros(3)])

        super().__init__(logits_fn, EOS + 1)

    def new_sequence(self):
        return LeaningSequence(self)


def conversation(answer: list[int]) -> tuple[list[int], list[int]]:
    chat = ChatTokenizer()
    turn1 = [{"role": "system", "content": "you edit files"}, {"role": "user", "content": "fix it: x = 1"}]
    first = chat.apply_chat_template(turn1, add_generation_prompt=True)
    history = [*turn1, {"role": "assistant", "content": bytes(answer).decode()}, {"role": "user", "content": "again"}]
    return first, chat.apply_chat_template(history, add_generation_prompt=True)


@pytest.mark.parametrize("markers", [TurnMarkers(HEADER, frozenset({IM_END})), None])
def test_a_next_turn_takes_its_last_answer_and_computes_what_a_fresh_prefill_does(markers):
    """The first turn's answer was decoded by steps (rows of a step's kind). With the chat template's markers a fresh
    prefill of the second turn computes that answer as a step's rows too, so the served engine takes them from the
    prompt cache; either way the second turn's text is a fresh prefill's. Without markers (decision 0018's rule) the
    answer's rows are computed again."""
    stop = StopConfig(max_tokens=12, ignore_eos=True)
    served = Engine(KindedBackend(), markers=markers)
    first, _ = conversation([])
    answer = served.generate(first, SamplingParams(), stop).run().token_ids
    assert all(97 <= t < 123 for t in answer)
    _, second = conversation(answer)
    assert second[: len(first) + len(answer)] == first + answer

    again = served.generate(second, SamplingParams(), stop)
    text = again.run().token_ids
    fresh = Engine(KindedBackend(), markers=markers).generate(second, SamplingParams(), stop)
    assert text == fresh.run().token_ids
    kept = len(first) + len(answer) - 1  # the answer's last token was emitted, never fed
    if markers is not None:
        assert again.stats.cached_tokens == kept  # the prompt and the answer's rows
    else:
        assert again.stats.cached_tokens <= len(first)


def test_without_the_plan_a_kept_answer_would_change_the_next_turn_s_text():
    """The check above can fail: a second turn that took every kept row (any-row reuse) holds the answer's rows of a
    step's kind where a fresh prefill without markers computes them in a wide pass, and the text differs."""
    from spekula.prompt_cache import PromptCache

    stop = StopConfig(max_tokens=12, ignore_eos=True)
    served = Engine(KindedBackend())
    served.prompt_cache = PromptCache(served.target, any_rows=True)
    first, _ = conversation([])
    _, second = conversation(served.generate(first, SamplingParams(), stop).run().token_ids)
    text = served.generate(second, SamplingParams(), stop).run().token_ids
    assert text != Engine(KindedBackend()).generate(second, SamplingParams(), stop).run().token_ids


@pytest.mark.parametrize("budget", [None, 5, 40])
def test_a_server_s_chunks_follow_the_plan_and_give_a_fresh_prefill_s_text(budget):
    """As Scheduler._chunk does: a chunk a round, at most `budget` tokens, the prompt's last chunk folded into the
    first step. Chunks stay inside one segment, the answer's are narrow, and the text is a fresh engine's."""
    markers = TurnMarkers(HEADER, frozenset({IM_END}))
    stop = StopConfig(max_tokens=12, ignore_eos=True)
    first, _ = conversation([])
    reference = Engine(KindedBackend(), markers=markers)
    _, second = conversation(reference.generate(first, SamplingParams(), stop).run().token_ids)
    expected = reference.generate(second, SamplingParams(), stop).run().token_ids  # took turn 1's answer
    plan = reference.prompt_cache.plan(second[:-1])
    assert len(plan.narrow) == 1

    served = Engine(KindedBackend(), markers=markers)
    gen = served.generate(second, SamplingParams(), stop)
    cuts = []
    while True:
        start = gen.target_sequence.length if gen.target_sequence is not None else 0
        chunk = gen.prefill_chunk(budget)
        cuts.append((start, start + len(chunk.tokens), chunk.narrow))
        if len(chunk.tokens) == gen.prefill_left:
            gen.fold(chunk)
            break
        chunk.run()
        gen.prefilled()
    assert gen.run().token_ids == expected
    for start, end, narrow in cuts:
        s, e, in_narrow = plan.segment(start)
        assert end <= e and narrow == in_narrow
    assert any(narrow for *_, narrow in cuts) and cuts[-1][1] == len(second) - 1
