"""scripts/pass_costs.py on an in-memory model: every timed pass starts from the same cache, one line per
model and width in the documented format, and bad widths are refused before anything loads."""

from __future__ import annotations

import re

import pytest

from spekula.testing import FunctionSequence, random_table_backend

from scriptkit import loaded


@pytest.fixture(scope="module")
def script():
    with loaded("pass_costs.py") as module:
        yield module


class ByteCodec:
    def encode(self, text: str) -> list[int]:
        return list(text.encode())


class Recording(FunctionSequence):
    """Records the cache length at which every pass starts."""

    starts: list[int]

    def _forward(self, token_ids, num_logits):
        self.starts.append(self.length)
        return super()._forward(token_ids, num_logits)


def recording_backend():
    backend = random_table_backend(256, seed=0)
    starts: list[int] = []

    def new_sequence() -> Recording:
        seq = Recording(backend)
        seq.starts = starts
        return seq

    backend.new_sequence = new_sequence
    return backend, starts


def test_every_timed_pass_starts_from_the_context(script):
    backend, starts = recording_backend()
    context = list(range(10, 20))
    medians = list(script.time_passes(backend, context, [1, 3, 2], repeats=2))
    assert [n for n, _ in medians] == [1, 3, 2]
    assert all(len(seconds) == 1 and seconds[0] > 0 for _, seconds in medians)
    # the prefill, the warm-up pass after it, then 2 timed passes per width, each after truncating to the context
    assert starts == [0, 10] + [10] * 6
    assert backend.tokens_fed == 10 + 1 + 2 * (1 + 3 + 2)


def test_settings_alternate_pass_by_pass_with_a_median_each(script):
    backend, starts = recording_backend()
    made: list[str] = []
    settings = [lambda: made.append("a"), lambda: made.append("b")]
    medians = list(script.time_passes(backend, list(range(10, 20)), [1, 2], repeats=3, settings=settings))
    assert [(n, len(seconds)) for n, seconds in medians] == [(1, 2), (2, 2)]
    assert made == ["a", "b"] * 6  # per width, per repeat: each setting, then its pass
    assert starts == [0, 10] + [10] * 12


def test_q6_K_settings_need_the_llamacpp_runtime(script):
    with pytest.raises(SystemExit):
        script.parse_args(["--q6-K-zmm-runs", "7,0"])  # the default runtime: transformers
    with pytest.raises(SystemExit):
        script.parse_args(["--runtime", "llamacpp", "--q6-K-zmm-runs", "8"])
    assert script.parse_args(["--runtime", "llamacpp", "--q6-K-zmm-runs", "7,0"]).q6_K_zmm_runs == [7, 0]


def test_main_prints_one_line_per_model_and_width(script, monkeypatch, capsys):
    loaded, exact = [], []

    def load_model(name, config):
        loaded.append((name, config.runtime, config.dtype))
        exact.append(config.exact)
        return random_table_backend(256, seed=1), ByteCodec()

    monkeypatch.setattr(script, "load_model", load_model)
    argv = ["--runtime", "native", "--context", "12", "--widths", "1,4", "--repeats", "2", "a", "b"]
    assert script.main(argv) == 0
    assert loaded == [("a", "native", "float32"), ("b", "native", "float32")]
    lines = capsys.readouterr().out.splitlines()
    pattern = re.compile(r"^(a|b) native float32 context=12 S=(1|4): \d+ ms \(at most (\d+\.\d+)x at alpha = 1\)$")
    found = [pattern.match(line).groups() for line in lines]
    assert [(m, w) for m, w, _ in found] == [("a", "1"), ("a", "4"), ("b", "1"), ("b", "4")]
    assert found[0][2] == found[2][2] == "1.00"  # one token per one-token pass
    assert exact == [True, True]  # exact mode, as a request gets it, unless --no-exact
    assert script.main(["--runtime", "llamacpp", "--no-exact", "--widths", "1", "a"]) == 0
    assert exact[-1] is False


def test_the_bound_at_full_acceptance_is_tokens_per_pass_over_its_cost(script):
    assert script.bound_at_full_acceptance(4, 0.2, 0.1) == pytest.approx(2.0)  # 4 tokens for the price of 2
    assert script.bound_at_full_acceptance(17, 0.785, 0.077) == pytest.approx(17 * 0.077 / 0.785)


def test_defaults(script):
    args = script.parse_args([])
    assert args.widths == [1, 2, 5, 9] and args.models == script.DEFAULT_MODELS and args.repeats == 1


@pytest.mark.parametrize("argv", [["--widths", "1,x"], ["--widths", "0,2"], ["--widths", ","], ["--repeats", "0"]])
def test_bad_options_are_refused(script, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err
