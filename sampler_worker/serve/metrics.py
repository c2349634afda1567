# The HTTP server's counters, in Prometheus's text exposition format (`GET /metrics`).
#
# Contract: every counter and gauge is written from the event loop's thread only (a generation's results
# are recorded by a callback on the loop, never by its worker thread), so nothing here takes a lock.
# The text is the format's version 0.0.4: `# HELP` and `# TYPE` lines, then one sample a line.
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_PREFIX = "sampler_worker"


@dataclass(slots=True)
class Metrics:
    """What the server has done since it started.

    Attributes:
        requests: requests answered, by endpoint and HTTP status.
        prompt_tokens: prompt tokens evaluated.
        generated_tokens: tokens generated.
        rejections: first draws the grammar refused (each cost a mask).
        constraintd_seconds: time generations spent waiting on constraintd (sessions, accepts, masks).
        cancelled: generations ended early (a client gone, a deadline passed, a shutdown).
        queue_full: requests refused because the queue was full.
        active: generations running now (a cancelled one until its worker thread has ended).
        waiting: requests waiting for a free slot now.
        constraintd_sessions: constraintd sessions the server's generations hold open now (opened, not
            yet closed; a session whose close failed counts as closed: the server no longer holds it).
    """

    requests: Counter[tuple[str, int]] = field(default_factory=Counter)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    rejections: int = 0
    constraintd_seconds: float = 0.0
    cancelled: int = 0
    queue_full: int = 0
    active: int = 0
    waiting: int = 0
    constraintd_sessions: int = 0

    def render(self) -> str:
        """The counters as Prometheus text."""
        lines: list[str] = []

        def metric(name: str, kind: str, text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {_PREFIX}_{name} {text}")
            lines.append(f"# TYPE {_PREFIX}_{name} {kind}")
            lines.extend(f"{_PREFIX}_{name}{labels} {value:g}" for labels, value in samples)

        metric("requests_total", "counter", "HTTP requests answered, by endpoint and status.", [
            (f'{{endpoint="{endpoint}",code="{code}"}}', count)
            for (endpoint, code), count in sorted(self.requests.items())
        ])
        metric("prompt_tokens_total", "counter", "Prompt tokens evaluated.", [("", self.prompt_tokens)])
        metric("generated_tokens_total", "counter", "Tokens generated.", [("", self.generated_tokens)])
        metric("grammar_rejections_total", "counter",
               "First draws the grammar refused (redrawn under a mask).", [("", self.rejections)])
        metric("constraintd_wait_seconds_total", "counter", "Seconds generations waited on constraintd.",
               [("", self.constraintd_seconds)])
        metric("generations_cancelled_total", "counter",
               "Generations ended early: client gone, deadline passed or shutdown.", [("", self.cancelled)])
        metric("queue_full_total", "counter", "Requests refused because the queue was full.",
               [("", self.queue_full)])
        metric("generations_active", "gauge", "Generations running now.", [("", self.active)])
        metric("requests_waiting", "gauge", "Requests waiting for a free slot.", [("", self.waiting)])
        metric("constraintd_sessions_open", "gauge", "constraintd sessions the generations hold open.",
               [("", self.constraintd_sessions)])
        return "\n".join(lines) + "\n"
