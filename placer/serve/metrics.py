"""`GET /metrics`: what the server generated and what the runtime staged, for Prometheus.

Staging counters come from the runtime, by card, read between two forwards; request and
token counters from the server. All are cumulative since the server started:

    placer_staged_bytes_total{card}       bytes copied from host memory to the card
    placer_staging_copies_total{card}     those copies (one per staged cold expert)
    placer_cache_hits_total{card}         selected cold experts found in a cache slot
    placer_staging_fetches_total{card}    fetches of a layer's selected cold experts
    placer_staging_seconds_total{card}    time the staging copies took
    placer_prefetched_total{card}         experts prefetched (`serve --prefetch` only; and
    placer_prefetch_useful_total{card}    those in time, late and not selected, on the
    placer_prefetch_late_total{card}      replay's clock model: placer/runtime/prefetch.py;
    placer_prefetch_wasted_total{card}    their bytes: placer_prefetch_bytes_total{card})
    placer_generated_tokens_total         completion tokens generated
    placer_prompt_tokens_total            prompt tokens taken
    placer_requests_total{endpoint,status}
    placer_requests_running               requests being generated now
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from placer.runtime.counters import StagingCounters

PER_CARD = (("staged_bytes", "bytes", "Bytes staged from host memory to the card."),
            ("staging_copies", "copies", "Host-to-card copies, one per staged cold expert."),
            ("cache_hits", "cache_hits", "Selected cold experts found in a cache slot."),
            ("staging_fetches", "fetches", "Fetches of a layer's selected cold experts."),
            ("staging_seconds", "seconds", "Seconds the staging copies took."))
PREFETCH = (("prefetched", "prefetched", "Experts prefetched for the next MoE layer."),
            ("prefetch_useful", "useful", "Prefetched experts selected, in time (model clock)."),
            ("prefetch_late", "late", "Prefetched experts selected, late (model clock)."),
            ("prefetch_wasted", "wasted", "Prefetched experts their layer did not select."),
            ("prefetch_bytes", "prefetch_bytes", "Bytes the prefetch copies moved."))


class StagingCollector(Collector):
    """The runtime's counters by card, read while `gate` holds the model's forwards off."""

    def __init__(self, counters: StagingCounters, gate: AbstractContextManager) -> None:
        self.counters = counters
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        with self.gate:
            cards = self.counters.to_json()["per_card"]
        for name, key, doc in PER_CARD + (PREFETCH if self.counters.prefetching else ()):
            family = CounterMetricFamily(f"placer_{name}", doc, labels=["card"])
            for card in cards:
                family.add_metric([str(card["card"])], card[key])
            yield family


class ServerMetrics:
    """The registry `/metrics` shows, and the server's own counters."""

    def __init__(self, counters: StagingCounters, gate: AbstractContextManager) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StagingCollector(counters, gate))
        self.generated = Counter("placer_generated_tokens", "Completion tokens generated.",
                                 registry=self.registry)
        self.prompt = Counter("placer_prompt_tokens", "Prompt tokens taken.",
                              registry=self.registry)
        self.requests = Counter("placer_requests", "Requests answered.",
                                ["endpoint", "status"], registry=self.registry)
        self.running = Gauge("placer_requests_running", "Requests being generated now.",
                             registry=self.registry)
