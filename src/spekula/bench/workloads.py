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
from spekula.knobs import is_int

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

    def salted(self, line: str) -> WorkItem:
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
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):
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


# -- a warm server's traffic ------------------------------------------------------------------------

COLD, WARM = "cold", "warm"  # the proposer memory a bench figure is for (cold: a server just started)
RESENT = "resent"  # the category of a prompt sent again later: reported on a row of its own
RESEND = 0.2  # default share of a server sequence's requests that resend an earlier prompt
WARM_PREFIX = 200  # default requests before the reported ones (`--warm` without a number)
# What a user writes in front of a question asked again: a resent prompt is similar, not byte-identical.
RESEND_LINES = ("Again, please:", "Asking once more:", "Same question as before:", "One more time, please.")


@dataclass(frozen=True)
class ServerSequence:
    """One long mixed sequence of requests, as a server that has been running meets them: `prefix` (run but not
    reported: it fills each proposer's memory) then `reported`. Built by server_sequence."""

    prefix: tuple[WorkItem, ...]
    reported: tuple[WorkItem, ...]
    seed: int
    resend: float
    category_order: tuple[str, ...]  # the source workload's categories, then RESENT

    def categories(self) -> list[str]:
        """The reported categories, in the source workload's order (the sequence itself is shuffled)."""
        present = set(categories(self.reported))
        return [c for c in self.category_order if c in present]

    def describe(self) -> dict[str, Any]:
        """What the bench records about the proposer's memory of a warm run (results and manifest)."""
        return {
            "state": WARM,
            "prefix_requests": len(self.prefix),
            "requests_before": [len(self.prefix), len(self.prefix) + len(self.reported) - 1],
            "reported_requests": len(self.reported),
            "resent_reported": sum(i.category == RESENT for i in self.reported),
            "resend": self.resend,
            "seed": self.seed,
            "rule": "one memory for the whole run, as a server's: the prefix runs first (not reported), then each "
            "reported request drafts from its configuration's memory of every request before it; the reported "
            "prompts are ones the prefix never sent, except those of category 'resent' (an earlier prompt sent "
            "again, a line in front)",
            "prefix_ids": [i.id for i in self.prefix],
        }


def server_sequence(
    items: list[WorkItem], prefix: int, requests: int | None = None, seed: int = 0, resend: float = RESEND
) -> ServerSequence:
    """A warm server's traffic from a workload: each category's prompts (an edit session's turns together, in
    order) dealt in turn to the reported part and, when `prefix` > 0, to the prefix's pool, so every reported
    prompt is new to the server; each part in a seeded random order. At each request, with probability `resend`,
    a prompt sent earlier (in the prefix or the reported part) is sent again instead, as users resend similar
    questions (a line in front; category RESENT, id `<id>~againN`). The prefix is `prefix` requests, resending
    once its pool is used up; the reported part is `requests` requests (default: until every held-out prompt is
    sent), resending once its prompts are used up. The same seed gives the same sequence."""
    if prefix < 0:
        raise ConfigError(f"--warm takes the number of requests before the reported ones, >= 0; got {prefix}")
    if requests is not None and requests < 1:
        raise ConfigError(f"--requests must be >= 1, got {requests}")
    if not 0 <= resend < 1:
        raise ConfigError(f"--resend is the share of requests that resend an earlier prompt, in [0, 1); got {resend}")
    held, pool = _deal(_units(items), to_prefix=prefix > 0)
    if prefix and not pool:
        raise ConfigError(
            "a warm sequence deals each category's prompts in turn to the reported part and to the prefix, and with "
            "one prompt (or edit session) per category the prefix gets none: keep at least two of some category "
            "(e.g. --per-category 2), or --warm 0"
        )
    rng = random.Random(seed)
    rng.shuffle(held)
    rng.shuffle(pool)
    sent: list[list[WorkItem]] = []
    resends: dict[str, int] = {}
    head = _draw(pool, prefix, sent, resends, rng, resend)
    body = _draw(held, requests, sent, resends, rng, resend)
    order = (*categories(items), RESENT)
    return ServerSequence(tuple(head), tuple(body), seed, resend, order)


def _units(items: list[WorkItem]) -> list[list[WorkItem]]:
    """Each edit session's turns as one unit (by turn), every other item a unit of its own, in workload order."""
    units: list[list[WorkItem]] = []
    sessions: dict[str, list[WorkItem]] = {}
    for item in conversation_order(items):
        found = TURN.fullmatch(item.id)
        if found is None:
            units.append([item])
        elif found["session"] in sessions:
            sessions[found["session"]].append(item)
        else:
            sessions[found["session"]] = [item]
            units.append(sessions[found["session"]])
    return units


def _deal(units: list[list[WorkItem]], to_prefix: bool) -> tuple[list[list[WorkItem]], list[list[WorkItem]]]:
    """(held out for the reported part, the prefix's pool): each category's units in turn, the first held out."""
    if not to_prefix:
        return list(units), []
    held: list[list[WorkItem]] = []
    pool: list[list[WorkItem]] = []
    dealt: dict[str, int] = {}
    for unit in units:
        n = dealt.get(unit[0].category, 0)
        dealt[unit[0].category] = n + 1
        (held if n % 2 == 0 else pool).append(unit)
    return held, pool


def _draw(
    fresh: list[list[WorkItem]],
    limit: int | None,
    sent: list[list[WorkItem]],
    resends: dict[str, int],
    rng: random.Random,
    resend: float,
) -> list[WorkItem]:
    """Up to `limit` requests (None: until `fresh` is used up): the next fresh unit, or with probability `resend`
    (always, once `fresh` is used up) a unit of `sent` sent again. Appends what it sends fresh to `sent`."""
    out: list[WorkItem] = []
    fresh = list(fresh)
    while limit is None or len(out) < limit:
        if not fresh and (limit is None or not sent):
            break
        if sent and (not fresh or rng.random() < resend):
            out += _resent(rng.choice(sent), resends, rng.choice(RESEND_LINES))
        else:
            sent.append(fresh.pop(0))
            out += sent[-1]
    return out if limit is None else out[:limit]


def _resent(unit: list[WorkItem], resends: dict[str, int], line: str) -> list[WorkItem]:
    """`unit` asked again: `line` in front of each turn's first message, category RESENT, ids `<id>~againN` (an edit
    session's turns keep their `-turnN` ending, so they still read as one conversation)."""
    key = unit[0].id
    resends[key] = resends.get(key, 0) + 1
    out = []
    for item in unit:
        found = TURN.fullmatch(item.id)
        again = f"~again{resends[key]}"
        new_id = f"{found['session']}{again}-turn{found['turn']}" if found else f"{item.id}{again}"
        out.append(replace(item.salted(line), id=new_id, category=RESENT))
    return out


def check_repeats(repeats: int) -> None:
    """--repeats' one check (in-process runs, endpoint runs, a warm sequence's phases)."""
    if not is_int(repeats) or repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats!r}")


def split_sequence(items: list[WorkItem], parts: int) -> list[list[WorkItem]]:
    """`items` cut into `parts` consecutive runs of about equal length, never between two turns of one session."""
    check_repeats(parts)
    cuts = []
    for p in range(1, parts):
        at = round(p * len(items) / parts)
        while 0 < at < len(items) and _same_session(items[at - 1], items[at]):
            at += 1
        cuts.append(at)
    bounds = [0, *cuts, len(items)]
    chunks = [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    if any(not chunk for chunk in chunks):
        raise ConfigError(f"{len(items)} reported requests cannot make {parts} phases; lower --repeats")
    return chunks


def _same_session(a: WorkItem, b: WorkItem) -> bool:
    found_a, found_b = TURN.fullmatch(a.id), TURN.fullmatch(b.id)
    return bool(found_a and found_b and found_a["session"] == found_b["session"])
