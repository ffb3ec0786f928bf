"""Suffix lookup (SuffixDecoding, Oliaro et al. 2024; Snowflake's Arctic Inference; vLLM's method="suffix").

Find the longest suffix of the context (up to max_depth tokens) that occurred before, in this
request's prompt + output or in a bounded cache of earlier requests' outputs, and draft the most
frequent continuation of its occurrences, token by token, while the continuation's empirical
probability (count of the chosen token / count of all, multiplied along the draft) stays at or above
min_token_prob. The draft is at most spec_factor x the matched length long: a long match is evidence
that text is being copied, a 1-token match is weak. No model, no q: the verifier treats the draft as
one-hot, so the output is the target's whatever is drafted.

The suffix structure. A suffix trie of depth D has up to D nodes per token, which in Python objects
costs far more memory than the text itself; SuffixDecoding's C++ tree compresses paths, which is hard
to keep cheap in Python. Here a trie node (a string s) is represented by the set of occurrences of s
instead: every position of every sequence is indexed under its *anchors*, the n tokens before it for n
in ANCHORS (1, 2, 4, 8), in hash tables that map an anchor to its positions in insertion order (what
zlib's match finder does with its hash chains). A lookup takes the most recent max_candidates
positions of the longest anchor of the context that occurred, extends each match backwards by slice
comparison up to max_depth (binary search), and keeps the longest; the counts at the trie node are the
counts of the tokens that follow those positions. Appending a token costs len(ANCHORS) table updates,
removing a sequence the same per token, and a lookup is bounded by the anchors, max_candidates,
max_depth and the draft length, whatever the length of the context.

Cross-request memory lives in the factory's SuffixCache, for as long as the engine or server: each
finished request's output (and, with cache_prompts, its prompt) is one entry of a namespace (the
server's: a hash of the API key the request presented, spekula.server.state; bench's: one per repeat,
so no repeat drafts an earlier repeat's output of its own prompt); drafts only ever read their own
namespace. Entries are bounded by count and by bytes over all namespaces together (an upper bound
of what an entry and its index hold: BYTES_PER_TOKEN per token plus BYTES_PER_ENTRY, checked by
tests/unit/test_suffix.py), least recently used first out; a user sets the bounds and the other
knobs of SuffixOptions (SpecConfig.suffix, --suffix-* on generate and serve).

The copy cursor. A request that copies a text with edits (rename a variable, add type hints, respace
operators) breaks every suffix match at every edit, and the match that follows is too short to be
trusted for several tokens. The proposer therefore keeps a cursor (copy_cursor.CopyCursor) in the text a
long match (4 tokens or more) was copying, and moves it over each committed token; when the output leaves
the source, the cursor waits until two tokens in a row are found again within RESYNC_WINDOW tokens of where
the edit began, and from there drafts the source (draft class "resync-N", N the source tokens the cursor has
followed, edits skipped, which the controller learns apart from suffix matches, and does not mark down for
the rejections the edits cost: spekula.draft_class). Their first token is accepted far more often
than a short suffix match's (`scripts/experiments/ngram_replay.py RESULTS --by-class --draft suffix`
measures both on a bench run's greedy outputs). What an edit replaced (at most MAX_SUBSTITUTED source
tokens) is remembered for the request: drafts from the cursor apply it (a renamed variable is drafted
renamed at its next occurrence), and the cursor stays in step where the output makes the edit again. While
the cursor waits to realign, only a match of 2 x RESYNC_BELOW tokens or more moves it elsewhere (a short
one is mostly the output's own copy of an earlier edit). The cursor follows this request's own text only.

Draft classes. A draft's class is its matched length, bucketed (match_class), and its kind: "suffix" when
this request's own text holds the match, "resync" for the copy cursor's drafts, and "recall" when only
earlier requests' outputs hold it. A recalled draft is often another request's boilerplate followed by that
request's own data (a JSON template's keys, then its values), so its first token is accepted less often
than that of a draft from this request's own text after a match of the same length (`--by-class` measures
both), and the controller learns the kinds apart. A recalled match shorter than min_recall_match (4) tokens
drafts nothing: on a warm server a phrase of 1-3 tokens that earlier answers share is mostly followed by
something else in a new answer, and each such draft costs a wider pass; a template's repeated keys match
longer (docs/decisions/0023-short-recalls.md has the replays that chose 4).

Split matches. SuffixDecoding drafts the most frequent continuation of a match's occurrences while its
empirical probability, multiplied along the draft, stays at or above min_token_prob (0.1). Where the
occurrences disagree on the very next token, the lookup is a guess between texts, and such a draft's first
token is accepted far less often than one all occurrences agree on after a match of the same length
(`scripts/experiments/warm_replay.py RESULTS --split` measures both), while it costs a wider pass like any
other. So by default (unanimous_first) a draft starts only where every occurrence examined agrees on its first
token; later tokens follow the most frequent continuation as before (docs/decisions/0024-split-matches.md has
the replays that chose it).

Why not arctic-inference's own tree: its source distribution builds with torch >= 2.10, protobuf and
grpcio-tools in its build requirements and imports torch in setup.py, so installing it pulls torch
(and on Linux its CUDA wheels) into the build; the suffix tree itself is C++ (nanobind + cmake).
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise

from spekula.config import K_MAX, SamplingParams, SuffixOptions
from spekula.draft_class import AFTER_EDIT, NO_DRAFT, RECALLED, SUFFIX, DraftClass
from spekula.errors import ConfigError
from spekula.knobs import is_int, is_number
from spekula.noise import PositionalNoise
from spekula.proposers.base import EMPTY_DRAFT, Draft, Proposer, ProposerFactory
from spekula.proposers.copy_cursor import CopyCursor
from spekula.verify import Verdict

ANCHORS = (1, 2, 4, 8)  # anchor lengths indexed, ascending: a lookup starts from the longest that occurred
STRIDE = 1 << 32  # a position's code in an index: sequence id * STRIDE + offset
# Upper bounds of the memory a cached token costs (its place in the sequence, its position code, one table
# entry per anchor and for most long anchors a key of its own, with the tables' spare room) and an entry
# costs on top (its list, its place in the LRU order). tests/unit/test_suffix.py checks them with tracemalloc.
BYTES_PER_TOKEN = 1024
BYTES_PER_ENTRY = 2048
LOCAL = -1  # the entry id of this request's own context in a match
# Match-length buckets, the draft classes: the controller learns acceptance per class.
CLASS_BOUNDS = (1, 2, 4, 8, 16)
# The copy cursor (spekula.proposers.copy_cursor): the match length below which a realigned cursor drafts
# instead of the suffix match.
RESYNC_BELOW = 4
USER = SuffixOptions()  # the defaults of the knobs a user sets (SpecConfig.suffix, --suffix-* flags)


@dataclass(frozen=True)
class SuffixConfig:
    max_depth: int = USER.max_depth  # longest suffix of the context matched, in tokens
    max_candidates: int = 32  # most recent occurrences examined per lookup, per source (request, cache)
    spec_factor: float = USER.spec_factor  # a draft is at most spec_factor x matched length (+ spec_offset) tokens
    spec_offset: float = 0.0
    min_token_prob: float = USER.min_token_prob  # stop drafting below this empirical continuation probability
    max_draft: int = K_MAX  # tokens drafted per lookup at most (k caps it further)
    cache_entries: int = USER.cache_entries  # earlier requests kept for drafting (0: no cross-request cache)
    cache_bytes: int = USER.cache_bytes  # ... and their memory (bounded by BYTES_PER_TOKEN, BYTES_PER_ENTRY)
    cache_prompts: bool = False  # cache prompts too, not only outputs (the current prompt is always used)
    # a match that only earlier requests' outputs hold drafts when it is at least this long (see "Draft classes")
    min_recall_match: int = 4
    # a draft starts only where every occurrence of the match continues with the same token (see "Split matches")
    unanimous_first: bool = True

    def __post_init__(self) -> None:
        # the knobs a user sets are checked as SuffixOptions declares them, with the same words; the cache's
        # bound in bytes (a user sets it in MiB) here
        SuffixOptions(
            cache_entries=self.cache_entries,
            max_depth=self.max_depth,
            min_token_prob=self.min_token_prob,
            spec_factor=self.spec_factor,
        )
        if not is_int(self.cache_bytes) or self.cache_bytes < 0:
            raise ConfigError(
                f"suffix cache_bytes must be an integer >= 0 (0: no cross-request cache), got {self.cache_bytes!r}"
            )
        for name in ("max_candidates", "max_draft", "min_recall_match"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(f"suffix {name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.unanimous_first, bool):
            raise ConfigError(f"suffix unanimous_first must be true or false, got {self.unanimous_first!r}")
        if not is_number(self.spec_offset) or not self.spec_offset >= 0:
            raise ConfigError(f"suffix spec_offset must be >= 0, got {self.spec_offset!r}")

    @classmethod
    def from_options(cls, options: SuffixOptions, max_draft: int = K_MAX) -> SuffixConfig:
        """The user's knobs (SpecConfig.suffix) and the longest draft the engine verifies, the rest at defaults."""
        user = {name: value for name, value in asdict(options).items() if name != "cache_mb"}  # a user sets MiB
        return cls(**user, cache_bytes=options.cache_bytes, max_draft=max_draft)

    def draft_limit(self, match_length: int) -> int:
        """Longest draft after a match of this many tokens (SuffixDecoding's match-length rule)."""
        return min(self.max_draft, math.floor(self.spec_factor * match_length + self.spec_offset + 1e-9))


def anchor(tokens: Sequence[int], end: int, n: int) -> int:
    """The key of the n tokens before `end` (a token id for n = 1, else a hash: a collision only costs a
    candidate, since every match is checked token by token)."""
    return tokens[end - 1] if n == 1 else hash(tuple(tokens[end - n : end]))


def common_suffix(seq: list[int], end: int, context: list[int], limit: int) -> int:
    """Longest m <= limit with seq[end - m : end] == context[-m:] (limit <= end, limit <= len(context))."""
    n = len(context)
    if seq[end - limit : end] == context[n - limit :]:
        return limit
    lo, hi = 0, limit  # seq matches the last lo tokens, not the last hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if seq[end - mid : end] == context[n - mid :]:
            lo = mid
        else:
            hi = mid
    return lo


class SuffixIndex:
    """Token sequences, every position indexed under its anchors (the 1, 2, 4, 8 tokens before it).

    A position is indexed once a token follows it, so each indexed position has a continuation.
    tables[i] maps an anchor of length ANCHORS[i] to one position code, or to a list of codes when it
    occurred more than once. Sequence ids only grow and a sequence only grows at its end, so codes
    are appended in increasing order: each list is sorted, oldest first, and a removal is a bisection.
    """

    def __init__(self) -> None:
        self.seqs: dict[int, list[int]] = {}
        self.tables: tuple[dict[int, int | list[int]], ...] = tuple({} for _ in ANCHORS)
        self._last_id = -1

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Append tokens to sequence seq_id: the newest sequence, or a new one of a higher id."""
        if seq_id < self._last_id:
            raise ValueError(f"sequence {seq_id} is older than sequence {self._last_id}: only the newest may grow")
        self._last_id = seq_id
        seq = self.seqs.setdefault(seq_id, [])
        start = len(seq)
        seq.extend(tokens)
        base = seq_id * STRIDE
        for end in range(max(start, 1), len(seq)):
            code = base + end
            for n, table in zip(ANCHORS, self.tables, strict=True):
                if n > end:
                    break
                key = anchor(seq, end, n)
                old = table.get(key)
                if old is None:
                    table[key] = code
                elif isinstance(old, int):
                    table[key] = [old, code]
                else:
                    old.append(code)

    def remove(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id)
        base = seq_id * STRIDE
        for end in range(1, len(seq)):
            code = base + end
            for n, table in zip(ANCHORS, self.tables, strict=True):
                if n > end:
                    break
                key = anchor(seq, end, n)
                old = table[key]
                if isinstance(old, int):
                    del table[key]
                else:
                    del old[bisect_left(old, code)]
                    if len(old) == 1:
                        table[key] = old[0]

    def occurrences(self, level: int, key: int, limit: int) -> list[tuple[int, list[int], int]]:
        """(sequence id, sequence, end) of the `limit` most recent positions after anchor `key` of
        length ANCHORS[level], most recent first."""
        found = self.tables[level].get(key)
        if found is None:
            return []
        codes = [found] if isinstance(found, int) else found[: -limit - 1 : -1]
        out = []
        for code in codes:
            seq_id, end = divmod(code, STRIDE)
            out.append((seq_id, self.seqs[seq_id], end))
        return out

    def __len__(self) -> int:
        return sum(len(s) for s in self.seqs.values())


class SuffixCache:
    """Earlier requests' tokens for drafting, one SuffixIndex per namespace; bounded by entries and by
    bytes over all namespaces together, the least recently used entry evicted first. Thread-safe."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_tokens = max(0, (max_bytes - BYTES_PER_ENTRY) // BYTES_PER_TOKEN)  # of one entry
        self._lock = threading.Lock()
        self._spaces: dict[str, SuffixIndex] = {}
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()  # (namespace, entry id) -> tokens
        self._tokens = 0
        self._next_id = 0

    @property
    def entries(self) -> int:
        return len(self._lru)

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def nbytes(self) -> int:
        """The bound of the memory held, which max_bytes limits."""
        return self._tokens * BYTES_PER_TOKEN + len(self._lru) * BYTES_PER_ENTRY

    def namespaces(self) -> list[str]:
        with self._lock:
            return list(self._spaces)

    def add(self, namespace: str, tokens: Sequence[int]) -> int | None:
        """Cache `tokens` as one entry of `namespace` (its last max_tokens tokens if longer); returns
        the entry id, or None when nothing was cached (no room at all, or fewer than 2 tokens)."""
        if self.max_entries == 0 or self.max_tokens < 2 or len(tokens) < 2:
            return None
        tokens = list(tokens[-self.max_tokens :])
        with self._lock:
            need = len(tokens) * BYTES_PER_TOKEN + BYTES_PER_ENTRY
            while self._lru and (len(self._lru) >= self.max_entries or self.nbytes + need > self.max_bytes):
                self._evict(next(iter(self._lru)))
            entry = self._next_id
            self._next_id += 1
            self._spaces.setdefault(namespace, SuffixIndex()).extend(entry, tokens)
            self._lru[(namespace, entry)] = len(tokens)
            self._tokens += len(tokens)
            return entry

    def _evict(self, key: tuple[str, int]) -> None:
        namespace, entry = key
        self._tokens -= self._lru.pop(key)
        space = self._spaces[namespace]
        space.remove(entry)
        if not space.seqs:
            del self._spaces[namespace]

    def occurrences(self, namespace: str, level: int, key: int, limit: int) -> list[tuple[int, list[int], int]]:
        """As SuffixIndex.occurrences, in `namespace` only. Cached sequences never change once added,
        so the lists returned stay valid after the lock is released (even if evicted meanwhile)."""
        with self._lock:
            space = self._spaces.get(namespace)
            return [] if space is None else space.occurrences(level, key, limit)

    def touch(self, namespace: str, entries: set[int]) -> None:
        """These entries just served a draft: least recently used last."""
        with self._lock:
            for entry in entries:
                if (namespace, entry) in self._lru:
                    self._lru.move_to_end((namespace, entry))

    def drop(self, namespace: str) -> None:
        """Forget every entry of `namespace`."""
        with self._lock:
            for key in [key for key in self._lru if key[0] == namespace]:
                self._evict(key)

    def clear(self) -> None:
        with self._lock:
            self._spaces.clear()
            self._lru.clear()
            self._tokens = 0


@dataclass(frozen=True)
class SuffixMatch:
    length: int  # tokens of the context's suffix matched
    tokens: list[int]  # the draft: the most frequent continuation, up to config.draft_limit(length)
    entries: frozenset[int]  # cache entries whose continuation agrees with the draft's first token
    source: tuple[list[int], int] | None = None  # an occurrence the draft continues: (sequence, its next index)
    resync: bool = False  # the draft follows the copy cursor after an edit; length: the tokens the cursor followed
    recalled: bool = False  # the draft's first token continues only earlier requests' text, none of this request's


def match_class(length: int, kind: str = SUFFIX) -> DraftClass:
    """A match length's draft class, its bucket of CLASS_BOUNDS: "suffix-1", "suffix-2..3", "suffix-4..7",
    "suffix-8..15", "suffix-16+" (kind AFTER_EDIT, "resync": a draft that follows the copy cursor after an
    edit, by the source tokens it followed; kind RECALLED, "recall": a match held only by earlier requests'
    outputs)."""
    for lo, hi in pairwise(CLASS_BOUNDS):
        if length < hi:
            return DraftClass(kind, lo, hi - 1)
    return DraftClass(kind, CLASS_BOUNDS[-1])


class SuffixProposer(Proposer):
    """One request: its own context indexed incrementally, plus the factory's cache for its namespace."""

    free_to_draft = True  # an index lookup (spekula.shadow)

    def __init__(
        self,
        config: SuffixConfig = SuffixConfig(),
        cache: SuffixCache | None = None,
        namespace: str = "",
        vocab_size: int | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.namespace = namespace
        self.vocab_size = vocab_size
        self._local = SuffixIndex()  # this request's context, one sequence (id 0)
        self._tokens: list[int] = self._local.seqs.setdefault(0, [])  # the context the index covers
        self._prompt_len: int | None = None  # the first context seen is the prompt
        self._last: tuple[int, SuffixMatch | None] | None = None  # (context length, its match)
        self._closed = False
        # The copy cursor: the text a long match was copying, followed through this request's edits.
        self.cursor = CopyCursor()

    # -- the protocol ---------------------------------------------------------------------------

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionalNoise | None) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        match = self.match(context)
        if match is None:
            return EMPTY_DRAFT
        if match.entries and self.cache is not None:
            self.cache.touch(self.namespace, set(match.entries))
        return Draft(match.tokens[:k])

    def observe(self, context: list[int], verdict: Verdict) -> None:
        self._sync(context)

    def draft_class(self, context: list[int]) -> DraftClass:
        match = self.match(context)
        if match is None:
            return NO_DRAFT
        return match_class(match.length, AFTER_EDIT if match.resync else RECALLED if match.recalled else SUFFIX)

    def draft_length(self, context: list[int]) -> int:
        match = self.match(context)
        return 0 if match is None else len(match.tokens)

    def close(self) -> None:
        """The request is over: its output (and prompt, with cache_prompts) joins the cache."""
        if self._closed:
            return
        self._closed = True
        if self.cache is not None and self._prompt_len is not None:
            start = 0 if self.config.cache_prompts else self._prompt_len
            self.cache.add(self.namespace, self._tokens[start:])

    # -- lookup ---------------------------------------------------------------------------------

    def match(self, context: list[int]) -> SuffixMatch | None:
        """The longest suffix of `context` seen before and its most frequent continuation (None: no
        match, or no continuation passes min_token_prob). One lookup per context length."""
        self._sync(context)
        if self._last is not None and self._last[0] == len(context):
            return self._last[1]
        found = self._lookup()
        if found is not None and found.recalled and found.length < self.config.min_recall_match:
            found = None  # a short phrase other requests' answers share: mostly rejected (see "Draft classes")
        strong = found is not None and found.length >= RESYNC_BELOW
        cursor = self.cursor
        expected = cursor.draft(1, self.vocab_size) if cursor.in_step else []  # the token the cursor expects next
        if cursor.source is None:
            moves = strong
        elif cursor.edit:  # waiting to realign: a short match is mostly the output's own copy of an earlier edit
            moves = strong and found.length >= 2 * RESYNC_BELOW  # type: ignore[union-attr]  # strong: found is not None
        else:
            moves = strong and (not expected or expected[0] != found.tokens[0])  # type: ignore[union-attr]  # as above
        if moves and found is not None and found.source is not None:
            # a long match elsewhere, or the cursor lost: copying goes on from the match's occurrence
            cursor.start(found.source, found.length)
        elif expected and (cursor.realigned or cursor.substitutions) and cursor.synced > (found.length if found else 0):
            # the text being copied, found again after an edit or with this request's edits applied: the
            # tokens the cursor has followed are better evidence than the suffix that matched since the edit
            followed = cursor.draft(self.config.max_draft, self.vocab_size)
            if followed:
                found = SuffixMatch(cursor.synced, followed, frozenset(), cursor.source, resync=True)
        self._last = (len(context), found)
        return found

    def _sync(self, context: list[int]) -> None:
        """Index the tokens committed since the last call. Committed tokens only grow; a context that
        is not an extension of the indexed one (never in the engine) starts the index over."""
        done = len(self._tokens)
        if self._prompt_len is None:
            self._prompt_len = len(context)
        tail = min(done, self.config.max_depth)
        if len(context) < done or context[done - tail : done] != self._tokens[done - tail :]:
            self._local = SuffixIndex()
            self._tokens = self._local.seqs.setdefault(0, [])
            self._prompt_len = min(self._prompt_len, len(context))
            self._last = None
            self.cursor.stop()
            done = 0
        if len(context) > done:
            self._local.extend(0, context[done:])
            self.cursor.follow(context[done:])

    def _lookup(self) -> SuffixMatch | None:
        context = self._tokens
        n_context = len(context)
        config = self.config
        for level in range(len(ANCHORS) - 1, -1, -1):
            n = ANCHORS[level]
            if n > n_context:
                continue
            key = anchor(context, n_context, n)
            found = [(LOCAL, seq, end) for _, seq, end in self._local.occurrences(level, key, config.max_candidates)]
            if self.cache is not None:
                found += self.cache.occurrences(self.namespace, level, key, config.max_candidates)
            best, starts = 0, []
            for entry, seq, end in found:
                length = common_suffix(seq, end, context, min(config.max_depth, end, n_context))
                if length > best:
                    best, starts = length, [(entry, seq, end)]
                elif length == best and length:
                    starts.append((entry, seq, end))
            if best:
                return self._walk(best, starts)
        return None

    def _walk(self, length: int, starts: list[tuple[int, list[int], int]]) -> SuffixMatch | None:
        """Follow the most frequent continuation of the matched occurrences, from a first token they all agree on
        (unanimous_first). Ties go to the most recent occurrence (this request's own context first). An
        occurrence in this request's context that runs into its end continues with the draft itself: the
        context as it will be if the draft is accepted (a repeating text keeps repeating)."""
        config = self.config
        limit = config.draft_limit(length)
        draft: list[int] = []
        prob = 1.0
        live = starts
        entries: frozenset[int] = frozenset()
        source = None
        recalled = False
        while len(draft) < limit and live:
            nexts = []
            counts: dict[int, int] = {}
            for _entry, seq, pos in live:
                token = seq[pos] if pos < len(seq) else draft[pos - len(seq)]
                nexts.append(token)
                counts[token] = counts.get(token, 0) + 1
            token = max(counts, key=counts.__getitem__)
            if not draft and config.unanimous_first and counts[token] < len(live):
                break  # the match's occurrences disagree on what comes next: mostly rejected (see "Split matches")
            prob *= counts[token] / len(live)
            if prob < config.min_token_prob or (self.vocab_size is not None and not 0 <= token < self.vocab_size):
                break
            draft.append(token)
            live = [
                (entry, seq, pos + 1)
                for (entry, seq, pos), t in zip(live, nexts, strict=True)
                if t == token and (entry == LOCAL or pos + 1 < len(seq))
            ]
            if len(draft) == 1:
                entries = frozenset(entry for entry, _, _ in live if entry != LOCAL)
                recalled = all(entry != LOCAL for entry, _, _ in live)
                # the copy cursor follows this request's own text only: another request's output matched on
                # its shared boilerplate goes on with that request's data
                source = next(((seq, pos - 1) for entry, seq, pos in live if entry == LOCAL and pos <= len(seq)), None)
        return SuffixMatch(length, draft, entries, source, recalled=recalled) if draft else None


@dataclass
class SuffixFactory(ProposerFactory):
    """Makes a SuffixProposer per request and holds the cross-request cache (as long as the engine).

    namespace: create(namespace) keeps requests of different namespaces (e.g. hashes of API keys)
    from ever drafting each other's text."""

    config: SuffixConfig = SuffixConfig()
    vocab_size: int | None = None  # drafts stop before any id outside [0, vocab_size)
    name: str = "suffix"
    cache: SuffixCache = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.cache = SuffixCache(self.config.cache_entries, self.config.cache_bytes)

    def create(self, namespace: str = "") -> SuffixProposer:
        return SuffixProposer(self.config, self.cache, namespace, self.vocab_size)

    def forget(self, namespace: str) -> None:
        self.cache.drop(namespace)

    def describe(self) -> dict:
        c = self.config
        return {
            "proposer": self.name,
            "max_depth": c.max_depth,
            "spec_factor": c.spec_factor,
            "min_token_prob": c.min_token_prob,
            "cache_entries": c.cache_entries,
            "cache_bytes": c.cache_bytes,
        }
