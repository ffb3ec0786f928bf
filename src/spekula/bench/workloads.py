"""Workloads: the built-in suite shipped with the package, and users' own JSON Lines files.

A workload line is one JSON object:

    {"prompt": "def quicksort(arr):", "category": "code", "max_tokens": 64}
    {"messages": [{"role": "user", "content": "Summarise ..."}], "category": "qa"}

Exactly one of `prompt` (plain text; wrapped in the chat template only with --chat) or `messages`
(always through the model's chat template). Optional: `category` (default: the file's name),
`max_tokens`, `id` (default: <file>-<line>), `source` (where the text came from), `metadata`
(anything; carried into the results). Anything else is refused, so a typo such as "max_token"
does not silently fall back to a default.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from spekula.errors import ConfigError

BUILTIN = "builtin"
# The suite's categories, in the order reports show them; each is one file in bench/suite/.
# The multi-turn edit sessions are two categories so that the per-category table reports their later
# turns (whose context already holds the file twice) on a row of their own: repeat-editing holds each
# session's first turn (`<session>-turn1`), repeat-editing-later the turns after it (`<session>-turn2`).
# A run takes a session's turns one after the other (conversation_order), as a conversation would.
BUILTIN_CATEGORIES = (
    "code-completion",
    "code-editing",
    "json-extraction",
    "summarization-qa",
    "open-chat",
    "creative-writing",
    "repeat-editing",
    "repeat-editing-later",
)
ROLES = ("system", "user", "assistant")
KEYS = {"id", "prompt", "messages", "category", "max_tokens", "source", "metadata"}


class WorkloadError(ConfigError):
    """A workload file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class WorkItem:
    id: str
    category: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int | None = None
    source: str | None = None

    def encode(self, codec: Any, chat: bool = False) -> list[int]:
        """Token ids through the text layer: messages always use the chat template, a prompt only with chat."""
        if self.messages is not None:
            return codec.encode(messages=[dict(m) for m in self.messages])
        return codec.encode(self.prompt, chat=chat)

    def max_tokens_under(self, cap: int | None, default: int = 128) -> int:
        """The item's own max_tokens (or `default`), never above `cap`."""
        n = self.max_tokens if self.max_tokens is not None else (cap if cap is not None else default)
        return min(n, cap) if cap is not None else n

    def salted(self, line: str) -> "WorkItem":
        """The same item with `line` (and a newline) in front of its prompt, or of its first message."""
        if self.messages is not None:
            first, *rest = self.messages
            return replace(self, messages=({**first, "content": f"{line}\n{first['content']}"}, *rest))
        return replace(self, prompt=f"{line}\n{self.prompt or ''}")

    def chat_messages(self) -> list[dict[str, str]]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "category": self.category}
        if self.prompt is not None:
            d["prompt"] = self.prompt
        if self.messages is not None:
            d["messages"] = [dict(m) for m in self.messages]
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        if self.source is not None:
            d["source"] = self.source
        return d


def load_workload(spec: str | Path) -> list[WorkItem]:
    """'builtin' (the shipped suite) or a path to a JSON Lines file."""
    if str(spec) == BUILTIN:
        return builtin_workload()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise WorkloadError(f"workload file {str(spec)!r} does not exist; give a JSON Lines file or 'builtin'")
    items = parse_lines(path.read_text(encoding="utf-8").splitlines(), name=str(path), default_category=path.stem)
    if not items:
        raise WorkloadError(f"{path}: no prompts (every line is empty); add one JSON object per line")
    return items


def builtin_workload() -> list[WorkItem]:
    folder = resources.files("spekula.bench") / "suite"
    items: list[WorkItem] = []
    for category in BUILTIN_CATEGORIES:
        f = folder / f"{category}.jsonl"
        items.extend(
            parse_lines(
                f.read_text(encoding="utf-8").splitlines(), name=f"builtin:{category}.jsonl", default_category=category
            )
        )
    return conversation_order(items)


TURN = re.compile(r"(?P<session>.+)-turn(?P<turn>\d+)")


def conversation_order(items: list[WorkItem]) -> list[WorkItem]:
    """Each session's turns (ids `<session>-turn<N>`) one after the other, by N, where its first turn stands;
    every other item keeps its place. A chat's next turn comes right after the last, so what a server keeps
    between them (the prompt cache, the suffix proposer's memory) is measured as it would serve them."""
    turns: dict[str, list[tuple[int, int, WorkItem]]] = {}
    for position, item in enumerate(items):
        found = TURN.fullmatch(item.id)
        if found:
            turns.setdefault(found["session"], []).append((int(found["turn"]), position, item))
    ordered, placed = [], set()
    for item in items:
        found = TURN.fullmatch(item.id)
        if found is None:
            ordered.append(item)
        elif found["session"] not in placed:
            placed.add(found["session"])
            ordered.extend(i for _, _, i in sorted(turns[found["session"]], key=lambda t: t[:2]))
    return ordered


def parse_lines(lines: Iterable[str], name: str, default_category: str) -> list[WorkItem]:
    items: list[WorkItem] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}, line {number}"
        item = _parse_item(line, where, default_id=f"{Path(name).stem}-{number}", default_category=default_category)
        if item.id in seen:
            raise WorkloadError(f"{where}: id {item.id!r} was already used on line {seen[item.id]}; ids must be unique")
        seen[item.id] = number
        items.append(item)
    return items


def _parse_item(line: str, where: str, default_id: str, default_category: str) -> WorkItem:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise WorkloadError(
            f"{where}: not valid JSON ({e.msg} at column {e.colno}); each line must be one JSON object"
        ) from None
    if not isinstance(obj, dict):
        raise WorkloadError(f'{where}: expected a JSON object like {{"prompt": "..."}}, got {type(obj).__name__}')
    unknown = sorted(set(obj) - KEYS)
    if unknown:
        raise WorkloadError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(KEYS))}"
        )
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise WorkloadError(
            f'{where}: give exactly one of "prompt" (text) or "messages" (chat), '
            + ("not both" if has_prompt else "neither was given")
        )
    prompt = messages = None
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise WorkloadError(f'{where}: "prompt" must be a non-empty string')
    else:
        messages = _messages(obj["messages"], where)
    category = obj.get("category", default_category)
    if not isinstance(category, str) or not category.strip():
        raise WorkloadError(f'{where}: "category" must be a non-empty string, got {category!r}')
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise WorkloadError(f'{where}: "max_tokens" must be an integer >= 1, got {max_tokens!r}')
    item_id = obj.get("id", default_id)
    if not isinstance(item_id, str) or not item_id:
        raise WorkloadError(f'{where}: "id" must be a non-empty string, got {item_id!r}')
    source = obj.get("source")
    if source is not None and not isinstance(source, str):
        raise WorkloadError(f'{where}: "source" must be a string, got {source!r}')
    return WorkItem(item_id, category.strip(), prompt, messages, max_tokens, source)


def _messages(value: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise WorkloadError(f'{where}: "messages" must be a non-empty list of {{"role": ..., "content": ...}} objects')
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or "role" not in m or "content" not in m:
            raise WorkloadError(
                f'{where}: messages[{i}] must be an object with exactly "role" and "content", got {json.dumps(m)[:80]}'
            )
        if m["role"] not in ROLES:
            raise WorkloadError(f"{where}: messages[{i}].role must be one of {', '.join(ROLES)}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise WorkloadError(f"{where}: messages[{i}].content must be a string")
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] == "assistant":
        raise WorkloadError(
            f"{where}: the last message is the assistant's; end with a user (or system) message for the model to answer"
        )
    return tuple(out)


def categories(items: Iterable[WorkItem]) -> list[str]:
    """Categories in order of first appearance."""
    return list(dict.fromkeys(i.category for i in items))


def select(
    items: list[WorkItem],
    *,
    categories_wanted: Iterable[str] | None = None,
    per_category: int | None = None,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[WorkItem]:
    """Narrow a workload: keep some categories, the first N of each, at most `limit` in all, or a
    seeded random `sample` (the same seed picks the same prompts)."""
    if categories_wanted is not None:
        wanted = list(categories_wanted)
        known = categories(items)
        missing = [c for c in wanted if c not in known]
        if missing:
            raise ConfigError(
                f"unknown categor{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)}; this workload has "
                f"{', '.join(known)}"
            )
        items = [i for i in items if i.category in wanted]
    if per_category is not None:
        if per_category < 1:
            raise ConfigError(f"--per-category must be >= 1, got {per_category}")
        counts: dict[str, int] = {}
        kept = []
        for i in items:
            counts[i.category] = counts.get(i.category, 0) + 1
            if counts[i.category] <= per_category:
                kept.append(i)
        items = kept
    if sample is not None:
        if sample < 1:
            raise ConfigError(f"sample size must be >= 1, got {sample}")
        chosen = set(random.Random(seed).sample(range(len(items)), min(sample, len(items))))
        items = [i for n, i in enumerate(items) if n in chosen]  # keep file order
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {limit}")
        items = items[:limit]
    if not items:
        raise ConfigError("no prompts left after selection; loosen --categories / --per-category / --limit")
    return items
