"""A request's own speculation: the `spec` object of /v1/completions and /v1/chat/completions.

`{"spec": {"draft": "none"}}` decodes plainly with no proposer at all; `{"spec": {"k": N}}` fixes k for
that request; the response's `spec` says what the request ran. Greedy text is the same whichever it asks.
"""

from __future__ import annotations

import json

import httpx
import pytest

from spekula.cost import CostModel
from spekula.divergence import NEAR_TIES, guarantee
from spekula.server.app import create_app
from spekula.server.settings import ServerSettings

from serverkit import MODEL, fake_pipeline, serving

WAIT = 20.0  # seconds any single request may take before the test fails
CHAT = [{"role": "user", "content": "draft or not"}]


def counting_proposers(pipe) -> list[str]:
    """Every proposer the engine opens for a request is logged here (its namespace)."""
    opened: list[str] = []
    create = pipe.engine.proposer.create
    pipe.engine.proposer.create = lambda namespace="": opened.append(namespace) or create(namespace)
    return opened


def ask(url: str, path: str, spec: dict | None = None, **extra) -> dict:
    body = {"model": MODEL, "max_tokens": 40, **extra}
    body |= {"prompt": "Once upon a time"} if path == "/v1/completions" else {"messages": CHAT}
    if spec is not None:
        body["spec"] = spec
    r = httpx.post(url + path, json=body, timeout=WAIT)
    assert r.status_code == 200, r.text
    return r.json()


def text(answer: dict) -> str:
    choice = answer["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


@pytest.fixture(scope="module")
def fixed():
    """A server that drafts k = 4 with a draft model that is always right (alpha = 1 when greedy)."""
    pipe = fake_pipeline(draft="same", k=4)
    with serving(create_app(pipe, ServerSettings())) as running:
        running.pipe = pipe
        yield running


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_draft_none_decodes_plainly_with_no_proposer_beside_requests_that_draft(fixed, path):
    opened = counting_proposers(fixed.pipe)
    default = ask(fixed.url, path)
    assert len(opened) == 1 and default["spec"]["drafted"] > 0 and default["spec"]["proposer"] == "same"
    for spec in ({"draft": "none"}, {"k": 0}):
        plain = ask(fixed.url, path, spec)
        assert len(opened) == 1  # no proposer opened: nothing drafted, nothing paid for drafting
        assert (plain["spec"]["proposer"], plain["spec"]["k"], plain["spec"]["drafted"]) == ("none", 0, 0)
        assert plain["spec"]["k_chosen"] == {"0": plain["spec"]["target_passes"]} and plain["spec"]["tau"] == 1
        assert text(plain) == text(default)  # greedy: the same text either way
    again = ask(fixed.url, path, {"draft": "same"})  # the server's own proposer, by name
    assert again["spec"]["drafted"] > 0 and len(opened) == 2 and text(again) == text(default)


def test_a_request_fixes_its_own_k(fixed):
    default = ask(fixed.url, "/v1/completions")
    two = ask(fixed.url, "/v1/completions", {"k": 2})
    assert (two["spec"]["proposer"], two["spec"]["k"]) == ("same", 2) and default["spec"]["k"] == 4
    assert max(map(int, two["spec"]["k_chosen"])) == 2 and max(map(int, default["spec"]["k_chosen"])) == 4
    assert text(two) == text(default)


def test_a_streamed_plain_request_says_what_it_ran(fixed):
    body = {"model": MODEL, "prompt": "stream it", "max_tokens": 9, "stream": True, "spec": {"draft": "none"}}
    r = httpx.post(fixed.url + "/v1/completions", json=body, timeout=WAIT)
    last = [line for line in r.text.splitlines() if line.startswith("data: {")][-1]
    assert '"proposer":"none"' in last and '"drafted":0' in last and '"k":0' in last
    assert json.loads(last[len("data: ") :])["spec"]["guarantee"] == guarantee(fixed.pipe.target, shared=True).to_dict()


def test_every_answer_says_which_guarantee_it_had(fixed):
    """The fake target is block-invariant up to float rounding (a PyTorch-like runtime): near-ties, and why."""
    promise = ask(fixed.url, "/v1/chat/completions")["spec"]["guarantee"]
    assert promise["kind"] == NEAR_TIES and "a batch of requests or a kept prompt's cache" in promise["text"]
    assert promise == ask(fixed.url, "/v1/completions", {"draft": "none"})["spec"]["guarantee"]


def test_k_auto_and_a_fixed_k_on_a_server_that_chooses_k():
    pipe = fake_pipeline(draft="same", k=None, delay_s=0.002, draft_delay_s=0.0005)
    # the costs those delays give, frozen: measured ones would depend on the machine's load
    pipe.engine.costs = CostModel(target_s={n: 0.002 for n in range(1, 18)}, draft_s_per_token=0.0005, frozen=True)
    with serving(create_app(pipe, ServerSettings())) as running:
        card = httpx.get(running.url + "/v1/models").json()["data"][0]["speculation"]
        assert card == {"proposer": "same", "k": "auto", "k_max": pipe.engine.spec.k_max}
        auto = ask(running.url, "/v1/completions", {"k": "auto"})
        three = ask(running.url, "/v1/completions", {"k": 3})
    assert auto["spec"]["k"] == "auto" and auto["spec"]["drafted"] > 0
    assert three["spec"]["k"] == 3 and set(map(int, three["spec"]["k_chosen"])) <= {0, 1, 2, 3}
    assert max(map(int, three["spec"]["k_chosen"])) == 3 and text(three) == text(auto)


BAD = [
    # (spec, param, words in the message)
    ({"draft": "ngram"}, "spec.draft", "'spec.draft' must be 'none' or 'same' on this server"),
    ({"k": 17}, "spec.k", "between 0 and 16 (this server's k_max"),
    ({"k": "auto"}, "spec.k", "needs a server started with --k auto"),
    ({"draft": "none", "k": 2}, "spec.k", "must be 0 or left out"),
    ({"temperature": 0}, "spec.temperature", "unknown field 'spec.temperature'"),
    ([], "spec", "'spec' must be an object"),
]


@pytest.mark.parametrize("spec,param,words", BAD, ids=[b[1] + f"-{i}" for i, b in enumerate(BAD)])
@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_spec_is_a_400_naming_it_before_any_stream(fixed, spec, param, words, stream):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": stream, "spec": spec}
    r = httpx.post(fixed.url + "/v1/completions", json=body, timeout=WAIT)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"


def test_a_server_without_a_proposer_takes_draft_none_only():
    with serving(create_app(fake_pipeline(draft="none"), ServerSettings())) as running:
        plain = ask(running.url, "/v1/completions", {"draft": "none"})
        assert (plain["spec"]["proposer"], plain["spec"]["drafted"]) == ("none", 0)
        r = httpx.post(
            running.url + "/v1/completions",
            json={"model": MODEL, "prompt": "x", "spec": {"draft": "suffix"}},
            timeout=WAIT,
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == "spec.draft"
    assert "must be 'none' on this server (it runs no proposer)" in r.json()["error"]["message"]


def test_spec_says_where_the_request_s_time_went(fixed):
    """`spec.timings`: the engine's seconds by stage, within the request's own time (a reader can tell the target's
    passes from drafting and from the loop around them)."""
    timings = ask(fixed.url, "/v1/completions")["spec"]["timings"]
    assert set(timings) == {"prefill_s", "draft_s", "score_s", "accept_s", "advance_s", "total_s"}
    stages = timings["draft_s"] + timings["score_s"] + timings["accept_s"] + timings["advance_s"]
    assert timings["score_s"] > 0 and timings["draft_s"] > 0  # the fake target's passes and draft model take time
    assert stages + timings["prefill_s"] <= timings["total_s"]
