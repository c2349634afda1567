# Prometheus metrics: counters, gauges and histograms, rendered in the text exposition format (0.0.4) and
# served by a minimal asyncio HTTP endpoint (`GET /metrics`).
#
# Invariants:
# - Metrics are plain in-memory numbers updated on the event loop thread (worker threads never touch
#   them), so no locks; a render is a consistent-enough snapshot for scraping. The one exception is
#   `collector_seconds`, observed by the cyclic collector's callback on whatever thread collects: it has
#   that one writer (collections never overlap), and a render at worst misses the pause in progress.
# - Label values are escaped as the format requires; every family renders its HELP and TYPE lines, and a
#   histogram its cumulative buckets, `+Inf`, `_sum` and `_count`.
# - The HTTP endpoint answers one request per connection and nothing but GET of /metrics (404 otherwise;
#   431 for a request line past 64 KiB), then closes it.
# - Every answer the gRPC service gives is counted in `rpcs` by method and status: OK, the error of a
#   failed call, UNAUTHENTICATED from the token check (before the servicer), INVALID_ARGUMENT for a request
#   that does not decode; and each error a Step answers in an operation's place, in `step_errors`.
# Written here rather than depending on prometheus-client: the service needs a dozen series and no more.
from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Callable, Iterator

__all__ = ["Counter", "Gauge", "Histogram", "Metrics", "MetricsServer"]

Labels = tuple[str, ...]

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
COMPILE_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0)
COLLECTOR_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


class _Family:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, label_names: Labels = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = label_names

    def _labels(self, values: Labels, extra: str = "") -> str:
        pairs = [f'{n}="{_escape(v)}"' for n, v in zip(self.label_names, values, strict=True)]
        if extra:
            pairs.append(extra)
        return "{" + ",".join(pairs) + "}" if pairs else ""

    def samples(self) -> Iterator[str]:
        raise NotImplementedError

    def render(self) -> Iterator[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        yield from self.samples()


class Counter(_Family):
    """A count that only goes up, per label values."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, label_names: Labels = ()) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[Labels, float] = {} if label_names else {(): 0.0}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self._values[labels] = self._values.get(labels, 0.0) + by

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def samples(self) -> Iterator[str]:
        for labels, value in sorted(self._values.items()):
            yield f"{self.name}{self._labels(labels)} {_number(value)}"


class Gauge(_Family):
    """A value read when scraped, from a function of the service's state."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        super().__init__(name, help_text)
        self._read = read

    def samples(self) -> Iterator[str]:
        yield f"{self.name} {_number(self._read())}"


class Histogram(_Family):
    """Observations counted into cumulative buckets, per label values."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Labels = (),
        *,
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, label_names)
        self.buckets = buckets
        self._counts: dict[Labels, list[int]] = {}
        self._sums: dict[Labels, float] = {}

    def observe(self, value: float, *labels: str) -> None:
        counts = self._counts.get(labels)
        if counts is None:  # not setdefault: its default would be a new list at every observation
            counts = self._counts[labels] = [0] * (len(self.buckets) + 1)
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self._sums[labels] = self._sums.get(labels, 0.0) + value

    def samples(self) -> Iterator[str]:
        for labels, counts in sorted(self._counts.items()):
            running = 0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                running += count
                le = f'le="{_number(bound)}"'
                yield f"{self.name}_bucket{self._labels(labels, le)} {running}"
            yield f"{self.name}_sum{self._labels(labels)} {_number(self._sums[labels])}"
            yield f"{self.name}_count{self._labels(labels)} {running}"


class Metrics:
    """The service's metric families; gauges read the state through the functions given."""

    def __init__(
        self,
        *,
        sessions_open: Callable[[], float],
        vocabs: Callable[[], float],
        grammars: Callable[[], float],
        cache_bytes: Callable[[], float],
    ) -> None:
        self.rpcs = Counter(
            "constraintd_rpcs_total", "RPCs answered, by method and status code", ("method", "code")
        )
        self.rpc_seconds = Histogram(
            "constraintd_rpc_seconds", "Time to answer an RPC (stream: one message)", ("method",)
        )
        self.step_ops = Counter(
            "constraintd_step_operations_total", "Operations in Step messages, by kind", ("op",)
        )
        self.step_errors = Counter(
            "constraintd_step_errors_total",
            "Step operations answered with an error in their place, by kind and status code",
            ("op", "code"),
        )
        self.sessions_reclaimed = Counter(
            "constraintd_sessions_reclaimed_total", "Sessions removed after their idle time ran out"
        )
        self.compile_seconds = Histogram(
            "constraintd_compile_seconds",
            "Time to compile a constraint or load a vocabulary, by outcome",
            ("outcome",),
            buckets=COMPILE_BUCKETS,
        )
        # observed by the collector's callback (server/memory.py's CollectorPauses), not on the loop
        self.collector_seconds = Histogram(
            "constraintd_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector, which stop the event loop, by generation",
            ("generation",),
            buckets=COLLECTOR_BUCKETS,
        )
        self.lookahead_seconds = Counter(
            "constraintd_lookahead_seconds_total",
            "CPU time spent learning new grammars' first verdicts before their masks ask (server/ahead.py)",
        )
        self.lookahead_tops = Counter(
            "constraintd_lookahead_tops_total", "Stack tops whose verdicts the lookahead learnt"
        )
        self._families: tuple[_Family, ...] = (
            self.rpcs,
            self.rpc_seconds,
            self.step_ops,
            self.step_errors,
            self.sessions_reclaimed,
            self.compile_seconds,
            self.collector_seconds,
            self.lookahead_seconds,
            self.lookahead_tops,
            Gauge("constraintd_sessions_open", "Sessions open now", sessions_open),
            Gauge("constraintd_vocabularies", "Vocabularies registered", vocabs),
            Gauge("constraintd_grammars_cached", "Compiled grammars in the shared cache", grammars),
            # what the cache's bound (--max-grammar-cache-bytes) is measured against: memory a caller's
            # grammars may keep in the server once their sessions are gone, until the cache evicts them
            Gauge(
                "constraintd_grammar_cache_bytes",
                "Bytes the caches of compiled grammars and refused constraints hold, as they measure them",
                cache_bytes,
            ),
        )

    def render(self) -> str:
        """Every family in the Prometheus text exposition format."""
        return "".join(line + "\n" for family in self._families for line in family.render())


class MetricsServer:
    """`GET /metrics` over plain HTTP/1.0, one request per connection."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Starts listening; returns the port (useful when `port` is 0)."""
        self._server = await asyncio.start_server(self._answer, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request_line = await asyncio.wait_for(reader.readline(), 5.0)
            except ValueError:  # past the reader's limit (64 KiB) with no end of line
                status, body = "431 Request Header Fields Too Large", b"request line too long\n"
            else:
                method, path, *_ = [*request_line.decode("latin-1").split(), "", ""]
                if method == "GET" and path.split("?")[0] == "/metrics":
                    status, body = "200 OK", self._metrics.render().encode()
                else:
                    status, body = "404 Not Found", b"not found\n"
            head = (
                f"HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
