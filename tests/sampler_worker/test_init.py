"""sampler_worker's public API."""

from __future__ import annotations

import sampler_worker


def test_public_names() -> None:
    assert sorted(sampler_worker.__all__) == [
        "Candidates",
        "DEFAULT_ORDER",
        "LLAMA_DEFAULT_SEED",
        "MT19937",
        "SamplerChain",
        "SamplerSettings",
        "resolve_seed",
    ]
    for name in sampler_worker.__all__:
        assert getattr(sampler_worker, name) is not None
