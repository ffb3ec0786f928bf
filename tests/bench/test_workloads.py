"""The built-in suite and users' workload files: content, provenance, and errors that name the line."""

from __future__ import annotations

import difflib
import re

import pytest

from spekula.bench.workloads import (
    BUILTIN_CATEGORIES,
    WorkItem,
    WorkloadError,
    builtin_workload,
    categories,
    conversation_order,
    load_workload,
    select,
)
from spekula.errors import ConfigError

from benchkit import ByteCodec, write_jsonl

REPEAT = ("repeat-editing", "repeat-editing-later")
FENCED = re.compile(r"```[a-z]*\n(.*?)\n```", re.S)


def test_builtin_suite_has_ten_prompts_per_category_six_edit_sessions_and_sources():
    items = builtin_workload()
    assert categories(items) == list(BUILTIN_CATEGORIES)
    assert len(BUILTIN_CATEGORIES) >= 8
    for cat in BUILTIN_CATEGORIES:
        mine = [i for i in items if i.category == cat]
        assert len(mine) >= (6 if cat in REPEAT else 10), cat
        assert all(i.source for i in mine), f"{cat}: every prompt records where it came from"
    assert len({i.id for i in items}) == len(items)
    assert load_workload("builtin") == items


def _fenced(text):
    (body,) = FENCED.findall(text)
    return body


def test_repeat_editing_sessions_re_emit_the_file_and_carry_the_first_turn():
    items = builtin_workload()
    first = {i.id.removesuffix("-turn1"): i for i in items if i.category == "repeat-editing"}
    later = {i.id.removesuffix("-turn2"): i for i in items if i.category == "repeat-editing-later"}
    assert all(i.id.endswith("-turn1") for i in first.values())
    assert all(i.id.endswith("-turn2") for i in later.values())
    assert len(first) >= 6 and first.keys() == later.keys()  # every session has both turns
    assert select(items, categories_wanted=["repeat-editing-later"]) == list(later.values())
    for session, one in first.items():
        two = later[session]
        assert one.source and one.source == two.source, session
        assert re.search(r"CPython 3\.11\.7 .*PSF License|Debian 12 package .*GPL", one.source), one.source
        assert [m["role"] for m in one.messages] == ["user"]
        assert [m["role"] for m in two.messages] == ["user", "assistant", "user"]
        assert two.messages[0] == one.messages[0]  # turn 2's context is turn 1's conversation
        original = _fenced(one.messages[0]["content"])
        edited = _fenced(two.messages[1]["content"])
        assert 20 <= original.count("\n") + 1 <= 60, session
        assert edited != original, f"{session}: the first edit changed nothing"
        # the assistant re-emits the file: most of it verbatim, in long stretches
        blocks = difflib.SequenceMatcher(None, original, edited, autojunk=False).get_matching_blocks()
        assert sum(b.size for b in blocks) >= 0.8 * len(original), session
        assert max(b.size for b in blocks) >= 0.25 * len(original), session
        assert not FENCED.search(two.messages[2]["content"]), "the second request asks for an edit of the result"
        for item in (one, two):  # room for the whole file again, yet short enough for a CPU run
            assert len(original) <= 4 * item.max_tokens <= 4 * 640, item.id


def test_builtin_prompts_encode_through_the_text_layer():
    codec = ByteCodec()
    for item in builtin_workload():
        assert item.encode(codec)


def test_user_workload_prompt_and_messages(tmp_path):
    path = write_jsonl(
        tmp_path / "w.jsonl",
        [
            {"prompt": "hello", "max_tokens": 5},
            "",
            {"messages": [{"role": "user", "content": "hi"}], "category": "chat", "id": "greeting", "source": "me"},
        ],
    )
    a, b = load_workload(path)
    assert (a.id, a.category, a.prompt, a.max_tokens) == ("w-1", "w", "hello", 5)
    assert (b.id, b.category, b.messages, b.source) == ("greeting", "chat", ({"role": "user", "content": "hi"},), "me")
    assert (
        a.max_tokens_under(3) == 3
        and a.max_tokens_under(None) == 5
        and b.max_tokens_under(None) == 128
        and b.max_tokens_under(7) == 7
    )
    codec = ByteCodec()
    assert a.encode(codec) == list(b"hello")
    assert a.encode(codec, chat=True) == list(b"<user>hello\n<assistant>")
    assert b.encode(codec) == list(b"<user>hi\n<assistant>")


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "a"', "not valid JSON"),
        ('["a"]', "expected a JSON object"),
        ('{"prompt": "a", "max_token": 3}', "unknown key(s) 'max_token'"),
        ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "give exactly one of"),
        ('{"category": "x"}', "neither was given"),
        ('{"prompt": ""}', '"prompt" must be a non-empty string'),
        ('{"prompt": "a", "max_tokens": 0}', '"max_tokens" must be an integer >= 1, got 0'),
        ('{"prompt": "a", "max_tokens": "5"}', '"max_tokens" must be an integer'),
        ('{"messages": []}', '"messages" must be a non-empty list'),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0].role must be one of"),
        ('{"messages": [{"role": "user"}]}', "messages[0] must be an object"),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}',
            "the last message is the assistant's",
        ),
        ('{"prompt": "a", "id": "w-1"}', "id 'w-1' was already used on line 1"),
    ],
)
def test_bad_lines_are_refused_with_file_line_and_reason(tmp_path, line, message):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "first"}\n' + line + "\n")
    with pytest.raises(WorkloadError) as e:
        load_workload(path)
    assert f"{path}, line 2:" in str(e.value)
    assert message in str(e.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_workload(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="no prompts"):
        load_workload(tmp_path / "empty.jsonl")


def test_select():
    items = builtin_workload()
    two = select(items, per_category=2)
    assert len(two) == 2 * len(BUILTIN_CATEGORIES)
    assert [i.id for i in two[:2]] == [i.id for i in items[:2]]  # the first N, in file order
    some = select(items, categories_wanted=["open-chat", "code-editing"], per_category=1)
    assert [i.category for i in some] == ["code-editing", "open-chat"]
    assert select(items, sample=5, seed=3) == select(items, sample=5, seed=3)
    assert len(select(items, sample=5, seed=3)) == 5
    assert len(select(items, limit=4)) == 4
    with pytest.raises(ConfigError, match="unknown category poetry"):
        select(items, categories_wanted=["poetry"])


def test_a_sessions_turns_run_one_after_the_other():
    items = builtin_workload()
    ids = [i.id for i in items]
    for later in (i for i in items if i.category == "repeat-editing-later"):
        first = later.id.replace("-turn2", "-turn1")
        assert ids.index(later.id) == ids.index(first) + 1
    chosen = select(items, categories_wanted=["repeat-editing", "repeat-editing-later"], per_category=2)
    assert [i.id for i in chosen] == [f"repeat-editing-0{n}-turn{t}" for n in (1, 2) for t in (1, 2)]
    plain = [WorkItem("a", "x", prompt="p"), WorkItem("s-turn2", "y", prompt="p"), WorkItem("b", "x", prompt="p")]
    plain.append(WorkItem("s-turn1", "x", prompt="p"))
    assert [i.id for i in conversation_order(plain)] == ["a", "s-turn1", "s-turn2", "b"]
