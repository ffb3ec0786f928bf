"""Prometheus metrics, one registry per app (no global state), names in the spirit of vLLM's.

Speculative counters move step by step while a request runs (StepMeter diffs the request's
RequestStats after each step), so /metrics shows them moving during a long stream. Every count
comes from RequestStats: the same definitions as the CLI, traces and reports.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from spekula.trace import RequestStats

P = "spekula_"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5.0)
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
FINISH_REASONS = ("stop", "length", "abort", "timeout", "error")

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._declare_requests(self.registry)
        self._declare_speculation(self.registry)
        for endpoint in ENDPOINTS:  # present from the start, so rates have a zero to start from
            self.http_requests.labels(endpoint, "200")
        for reason in FINISH_REASONS:
            self.requests_finished.labels(reason)

    def _declare_requests(self, r: CollectorRegistry) -> None:
        """HTTP requests, generation requests, their tokens and latencies, the queue and the batches."""
        self.http_requests = Counter(
            P + "http_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"], registry=r
        )
        self.requests_finished = Counter(
            P + "request_finished",
            "Generation requests by how they ended: stop, length, abort (client gone), timeout, error",
            ["finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Output tokens generated", registry=r)
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "From a request's first step to its first output token (RequestStats.ttft_s)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            P + "time_per_output_token_seconds",
            "Per request: (total - ttft) / (output tokens - 1)",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds",
            "From arrival (queue included) to the last token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            P + "request_queue_time_seconds", "From arrival to the first step", buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            P + "batch_size",
            "Requests scored together in one batched target pass",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.waiting = Gauge(P + "num_requests_waiting", "Requests in the queue", registry=r)
        self.running = Gauge(P + "num_requests_running", "Requests being stepped", registry=r)

    def _declare_speculation(self, r: CollectorRegistry) -> None:
        """The spec_decode_* counters, in vLLM's names: drafts, drafted and accepted tokens (by position), passes."""
        self.drafts = Counter(
            P + "spec_decode_num_drafts", "Target passes that verified at least one drafted token", registry=r
        )
        self.draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Drafted tokens", registry=r)
        self.accepted_tokens = Counter(
            P + "spec_decode_num_accepted_tokens", "Drafted tokens the target accepted", registry=r
        )
        self.accepted_per_pos = Counter(
            P + "spec_decode_num_accepted_tokens_per_pos",
            "Accepted drafted tokens by draft position (0 = first)",
            ["position"],
            registry=r,
        )
        self.drafted_per_pos = Counter(
            P + "spec_decode_num_draft_tokens_per_pos",
            "Drafted tokens by draft position (0 = first)",
            ["position"],
            registry=r,
        )
        self.target_passes = Counter(
            P + "spec_decode_num_target_passes", "Target decode passes (plain steps included)", registry=r
        )
        self.steps_by_k = Counter(
            P + "spec_decode_steps", "Steps by the draft length k the controller chose (0 = plain)", ["k"], registry=r
        )

    def track_queue(self, waiting: Callable[[], int], running: Callable[[], int]) -> None:
        self.waiting.set_function(waiting)
        self.running.set_function(running)

    def render(self) -> bytes:
        # prometheus_client adds a `*_created` timestamp series per counter; the switch that turns
        # them off is process-global, so they are dropped here instead (none of ours ends in it).
        text = generate_latest(self.registry)
        return b"\n".join(line for line in text.split(b"\n") if b"_created" not in line)

    def finished(self, reason: str, stats: RequestStats | None, e2e_s: float) -> None:
        self.requests_finished.labels(reason).inc()
        self.e2e.observe(e2e_s)
        if stats is not None and stats.ttft_s is not None and stats.output_tokens > 1:
            self.tpot.observe((stats.total_s - stats.ttft_s) / (stats.output_tokens - 1))


class StepMeter:
    """Adds what one request's RequestStats gained since the last call to the server's counters."""

    def __init__(self, metrics: ServerMetrics, stats: RequestStats) -> None:
        self.metrics = metrics
        self.stats = stats
        self.seen = RequestStats()
        self.ttft_seen = False

    def update(self) -> None:
        m, s, seen = self.metrics, self.stats, self.seen
        _add(m.generation_tokens, s.output_tokens - seen.output_tokens)
        _add(m.target_passes, s.target_passes - seen.target_passes)
        _add(m.drafts, s.drafts - seen.drafts)
        _add(m.draft_tokens, s.drafted - seen.drafted)
        _add(m.accepted_tokens, s.accepted - seen.accepted)
        for per_pos, now, before in (
            (m.accepted_per_pos, s.accepted_per_position, seen.accepted_per_position),
            (m.drafted_per_pos, s.drafted_per_position, seen.drafted_per_position),
        ):
            for i, count in enumerate(now):
                _add(per_pos.labels(str(i)), count - (before[i] if i < len(before) else 0))
        for k, count in s.k_chosen.items():
            _add(m.steps_by_k.labels(str(k)), count - seen.k_chosen.get(k, 0))
        if s.ttft_s is not None and not self.ttft_seen:
            self.ttft_seen = True
            m.ttft.observe(s.ttft_s)
        seen.output_tokens, seen.target_passes, seen.drafts = s.output_tokens, s.target_passes, s.drafts
        seen.drafted, seen.accepted = s.drafted, s.accepted
        seen.accepted_per_position = list(s.accepted_per_position)
        seen.drafted_per_position = list(s.drafted_per_position)
        seen.k_chosen = dict(s.k_chosen)


def _add(counter, amount: int) -> None:
    if amount > 0:
        counter.inc(amount)
