"""Detokenizing in chunks and stop strings, with a byte-level tokenizer (token id = byte)."""

import pytest

from spekula.text import IncrementalDetokenizer, StopMatcher, TextCodec


class ByteTokenizer:
    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return list(text.encode())

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")

    def get_vocab(self):
        return {bytes([i]).decode("latin-1"): i for i in range(256)}


CODEC = TextCodec(ByteTokenizer())


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_chunks_reassemble_utf8_without_replacement_chars(chunk):
    text = "naïve — 東京 🚀 ok"
    ids = CODEC.encode(text)
    detok = IncrementalDetokenizer(CODEC)
    pieces = [detok.feed(ids[i : i + chunk]) for i in range(0, len(ids), chunk)] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_split_across_chunks_is_never_emitted():
    m = StopMatcher(("\n\n", "END"))
    out = [m.feed(d) for d in ["abc E", "N", "D more"]]
    assert "".join(out) == "abc " and m.stopped
    assert m.feed("later") == "" and m.flush() == ""


def test_partial_stop_prefix_is_released_when_it_is_not_a_stop():
    m = StopMatcher(("END",))
    assert m.feed("xE") == "x"
    assert m.feed("Nx") == "ENx"
    assert not m.stopped
    assert m.feed("E") == "" and m.flush() == "E"


def test_earliest_stop_wins():
    m = StopMatcher(("b", "a"))
    assert m.feed("xxabyy") == "xx"


def test_chat_without_template_is_refused():
    from spekula.errors import ConfigError

    with pytest.raises(ConfigError, match="no chat template"):
        CODEC.encode("hi", chat=True)
