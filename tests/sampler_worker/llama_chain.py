"""llama.cpp's sampler chain for given settings: the constructors `common_sampler_init` calls."""

from __future__ import annotations

from typing import Any

from sampler_worker.chain import SamplerSettings


def llama_steps(settings: SamplerSettings, n_vocab: int) -> list[tuple[str, tuple[Any, ...]]]:
    """Steps for tests/oracle.py's `LlamaSamplerChain`, in `common_sampler_init`'s order (mirostat off)."""
    s = settings
    steps: list[tuple[str, tuple[Any, ...]]] = []
    if s.logit_bias:
        steps.append(("logit_bias", (n_vocab, list(s.logit_bias))))
    table: dict[str, tuple[str, tuple[Any, ...]]] = {
        "penalties": ("penalties", (n_vocab, s.penalty_last_n, s.repeat_penalty, s.frequency_penalty,
                                    s.presence_penalty)),
        "top_k": ("top_k", (s.top_k,)),
        "typ_p": ("typical", (s.typical_p, s.min_keep)),
        "top_p": ("top_p", (s.top_p, s.min_keep)),
        "min_p": ("min_p", (s.min_p, s.min_keep)),
        "temperature": ("temp_ext", (s.temperature, s.dynatemp_range, s.dynatemp_exponent)),
    }
    steps.extend(table[name] for name in s.order if name in table)
    steps.append(("dist", (s.seed,)))
    return steps
