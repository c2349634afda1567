"""sampler_worker's public API."""

from __future__ import annotations

import sampler_worker


def test_public_names() -> None:
    assert sorted(sampler_worker.__all__) == [
        "Candidates",
        "Counters",
        "DEFAULT_ORDER",
        "Generation",
        "GenerationError",
        "LLAMA_DEFAULT_SEED",
        "MT19937",
        "Model",
        "ModelError",
        "SamplerChain",
        "SamplerSettings",
        "Step",
        "check_vocab",
        "default_model_path",
        "generate",
        "prompt_tokens",
        "resolve_seed",
    ]
    for name in sampler_worker.__all__:
        assert getattr(sampler_worker, name) is not None
