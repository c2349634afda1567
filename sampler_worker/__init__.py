"""The sampler worker: a GGUF model, llama.cpp's sampler chain in numpy, constrained generation.

`SamplerChain.from_settings(SamplerSettings(...))` is the chain llama-server builds (penalties, top-k,
typical-p, top-p, min-p, temperature, then a seeded mt19937 `dist` draw), token for token; a masked
redraw after a grammar rejection is `chain.sample(logits, allowed=mask)` with the same generator.
`generate(Model(path), tokens, settings, session=...)` runs llama-server's generation loop with the
grammar held by a constraintd session (`clients.Client(...).session(...)`).
"""

from sampler_worker.candidates import Candidates
from sampler_worker.chain import DEFAULT_ORDER, SamplerChain, SamplerSettings
from sampler_worker.generate import Counters, Generation, GenerationError, Step, generate
from sampler_worker.model import Model, ModelError, check_vocab, default_model_path
from sampler_worker.mt19937 import LLAMA_DEFAULT_SEED, MT19937, resolve_seed
from sampler_worker.prompt import prompt_tokens

__all__ = [
    "DEFAULT_ORDER",
    "LLAMA_DEFAULT_SEED",
    "MT19937",
    "Candidates",
    "Counters",
    "Generation",
    "GenerationError",
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
