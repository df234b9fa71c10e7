"""GET /metrics: Triton's metrics (its own endpoint, fetched per scrape) followed by the frontend's.

Frontend metrics (prometheus_client, own registry):
  openai_requests_total{endpoint, status}      requests answered, by route and HTTP status
  openai_request_duration_seconds{endpoint}    time in the frontend per request, from the request's
                                               arrival to its last byte (streams included), histogram
  openai_requests_in_flight                    /v1 requests being served now
If Triton's metrics endpoint does not answer, a comment line says so and the frontend's still follow.
"""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/load_lora_adapter",
             "/v1/unload_lora_adapter", "/tokenize", "/detokenize", "/health", "/health/ready", "/metrics")


class FrontendMetrics:
    def __init__(self, triton_metrics_url: str | None):
        self.registry = CollectorRegistry()
        self.requests = Counter("openai_requests", "OpenAI API requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=self.registry)
        self.duration = Histogram("openai_request_duration_seconds",
                                  "Time in the OpenAI frontend per request, arrival to last byte (streams included)",
                                  ["endpoint"], registry=self.registry,
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.in_flight = Gauge("openai_requests_in_flight", "OpenAI /v1 requests being served now",
                               registry=self.registry)
        self.triton_metrics_url = triton_metrics_url
        self._http: httpx.AsyncClient | None = None

    @staticmethod
    def endpoint(path: str) -> str:
        if path.startswith("/v1/models"):
            return "/v1/models"
        return path if path in ENDPOINTS else "other"

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.duration.labels(endpoint).observe(seconds)

    async def exposition(self) -> bytes:
        """Triton's text then ours (Prometheus text format 0.0.4)."""
        head = b""
        if self.triton_metrics_url:
            if self._http is None:
                self._http = httpx.AsyncClient(timeout=5.0)
            try:
                r = await self._http.get(self.triton_metrics_url)
                r.raise_for_status()
                head = r.content if r.content.endswith(b"\n") else r.content + b"\n"
            except httpx.HTTPError as e:
                head = f"# Triton metrics unavailable from {self.triton_metrics_url}: {type(e).__name__}\n".encode()
        return head + generate_latest(self.registry)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
