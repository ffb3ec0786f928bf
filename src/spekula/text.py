"""Text in and out: the only place that knows about tokenizers.

- TextCodec: prompt -> token ids (optionally through the model's chat template), ids -> text; where the template
  puts the assistant's messages (turn_markers: spekula.prefill_plan).
- IncrementalDetokenizer: token ids arrive in chunks; text comes out only when it is complete UTF-8
  (a multi-byte character split across tokens is held back, never emitted as '\ufffd').
- StopMatcher: stop strings on the text stream; text that could be the start of a stop string is
  held back until it is known not to be one, and nothing after a stop string is ever emitted.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spekula.errors import ConfigError
from spekula.prefill_plan import TurnMarkers


class TextCodec:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, path: str | Path) -> TextCodec:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    def encode(
        self, prompt: str | None = None, messages: list[dict[str, str]] | None = None, chat: bool = False
    ) -> list[int]:
        """Token ids for a plain prompt, or for chat messages through the model's template."""
        if messages is None and prompt is None:
            raise ConfigError("give a prompt or chat messages")
        if messages is None and not chat:
            return list(self.tokenizer.encode(prompt, add_special_tokens=True))
        if messages is None:
            assert prompt is not None  # checked above
            messages = [{"role": "user", "content": prompt}]
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                "this model has no chat template; send a plain prompt instead of chat messages (drop --chat)"
            )
        return self._template_ids(messages, generation_prompt=True)

    def _template_ids(self, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        """The chat template's token ids for these messages."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def turn_markers(self) -> TurnMarkers | None:
        """Where the chat template puts the assistant's messages in a prompt's ids (spekula.prefill_plan), found by
        rendering a one-message conversation with and without the generation prompt and with an answer; None where
        the tokenizer has no template, or one that renders these so that the answer is not between a header and an
        end token."""
        tokenizer = self.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            return None
        user = [{"role": "user", "content": "Hi"}]
        answer = "Hello there"
        try:
            bare, prompted = self._template_ids(user, False), self._template_ids(user, True)
            answered = self._template_ids([*user, {"role": "assistant", "content": answer}], False)
            text = [int(i) for i in tokenizer.encode(answer, add_special_tokens=False)]
        except Exception:  # a template that refuses these messages: no markers, prompts prefilled as before
            return None
        header, rest = prompted[len(bare) :], answered[len(prompted) :]
        if prompted[: len(bare)] != bare or answered[: len(prompted)] != prompted or not header:
            return None
        if rest[: len(text)] != text or len(rest) <= len(text):
            return None
        eos = getattr(tokenizer, "eos_token_id", None)
        return TurnMarkers(tuple(header), frozenset({rest[len(text)], *([eos] if isinstance(eos, int) else [])}))

    def vocabulary_fingerprint(self) -> str:
        """Hash of token -> id; two tokenizers with equal fingerprints map text to the same ids."""
        vocab = sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        return hashlib.sha256(repr(vocab).encode()).hexdigest()[:16]


class IncrementalDetokenizer:
    """Decodes a growing list of ids into text deltas (the prefix-offset scheme of TGI / vLLM)."""

    def __init__(self, codec: TextCodec, context_ids: list[int] | None = None) -> None:
        self.codec = codec
        self.ids: list[int] = list(context_ids[-4:]) if context_ids else []  # a little context fixes leading spaces
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def feed(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix_text = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self.codec.decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end (possibly an incomplete character)."""
        prefix_text = self.codec.decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self.codec.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]


@dataclass
class StopMatcher:
    stop: tuple[str, ...]
    held: str = ""
    stopped: bool = False

    def feed(self, delta: str) -> str:
        """Text safe to emit now. Sets `stopped` when a stop string appears (it is not emitted)."""
        if self.stopped:
            return ""
        text = self.held + delta
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            self.held = ""
            return text[: min(hits)]
        keep = max((n for s in self.stop for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        text, self.held = ("" if self.stopped else self.held), ""
        return text
