"""The Prometheus text exposition (constraintd/server/metrics.py)."""

from __future__ import annotations

from constraintd.server.metrics import Counter, Gauge, Histogram, Metrics


def test_a_counter_renders_help_type_and_escaped_labels() -> None:
    counter = Counter("x_total", "Things", ("kind",))
    counter.inc('a"b\\c\nd')
    counter.inc("plain", by=2.5)
    assert list(counter.render()) == [
        "# HELP x_total Things",
        "# TYPE x_total counter",
        'x_total{kind="a\\"b\\\\c\\nd"} 1',
        'x_total{kind="plain"} 2.5',
    ]


def test_an_unlabelled_counter_starts_at_zero() -> None:
    assert list(Counter("n_total", "N").render())[-1] == "n_total 0"


def test_a_histogram_renders_cumulative_buckets_sum_and_count() -> None:
    histogram = Histogram("t_seconds", "Time", ("m",), buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value, "Accept")
    assert list(histogram.render())[2:] == [
        't_seconds_bucket{m="Accept",le="0.1"} 2',
        't_seconds_bucket{m="Accept",le="1"} 3',
        't_seconds_bucket{m="Accept",le="+Inf"} 4',
        't_seconds_sum{m="Accept"} 3.65',
        't_seconds_count{m="Accept"} 4',
    ]


def test_a_gauge_reads_its_value_when_rendered() -> None:
    value = [3]
    gauge = Gauge("g", "G", lambda: value[0])
    value[0] = 7
    assert list(gauge.render())[-1] == "g 7"


def test_the_service_metrics_render_every_family() -> None:
    metrics = Metrics(sessions_open=lambda: 2, vocabs=lambda: 1, grammars=lambda: 0, cache_bytes=lambda: 5)
    text = metrics.render()
    assert text.endswith("\n")
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert types == [
        "constraintd_rpcs_total",
        "constraintd_rpc_seconds",
        "constraintd_step_operations_total",
        "constraintd_step_errors_total",
        "constraintd_sessions_reclaimed_total",
        "constraintd_compile_seconds",
        "constraintd_gc_pause_seconds",
        "constraintd_lookahead_seconds_total",
        "constraintd_lookahead_tops_total",
        "constraintd_sessions_open",
        "constraintd_vocabularies",
        "constraintd_grammars_cached",
        "constraintd_grammar_cache_bytes",
    ]
    assert "constraintd_sessions_open 2" in text.splitlines()
    assert "constraintd_grammar_cache_bytes 5" in text.splitlines()
