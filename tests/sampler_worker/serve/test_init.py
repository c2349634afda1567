"""sampler_worker.serve's public API."""

from __future__ import annotations

import sampler_worker.serve


def test_public_api() -> None:
    assert sampler_worker.serve.__all__ == ["ServeState", "add_parser", "create_app", "run_serve", "serving"]
    for name in sampler_worker.serve.__all__:
        assert getattr(sampler_worker.serve, name) is not None
