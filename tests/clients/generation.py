"""A seeded generation any client can run, the way a sampler uses constraintd: draw a token, `accept_or_mask`;
on a rejection draw again from the mask. The same seed, grammar and vocabulary give the same tokens
whichever client, transport or server runs it, so runs can be compared token for token."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import numpy as np

from clients import AsyncSession, Session
from clients.masks import allowed_tokens

# A schema with room for long answers (strings, arrays), used for generations over a real vocabulary.
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"],
    }
)


def _redraw(rng: random.Random, mask: np.ndarray, vocab_size: int) -> int | None:
    allowed = allowed_tokens(mask, vocab_size)
    return int(allowed[rng.randrange(len(allowed))]) if len(allowed) else None


def generate(
    session: Session,
    *,
    seed: int,
    steps: int,
    eog: frozenset[int],
    before_step: Callable[[int], None] | None = None,
) -> list[int]:
    """Up to `steps` tokens (fewer when an end-of-generation token is drawn); the session's history."""
    rng = random.Random(seed)
    size = session.vocab.size
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        token: int | None = rng.randrange(size)
        mask = session.accept_or_mask(token)
        if mask is not None:
            token = _redraw(rng, mask, size)
            if token is None:
                break
            assert session.accept(token)
        if token in eog:
            break
    return list(session.history)


async def generate_async(
    session: AsyncSession,
    *,
    seed: int,
    steps: int,
    eog: frozenset[int],
    before_step: Callable[[int], object] | None = None,
) -> list[int]:
    """`generate` for an AsyncSession; `before_step` may return an awaitable, which is awaited."""
    rng = random.Random(seed)
    size = session.vocab.size
    for step in range(steps):
        if before_step is not None:
            waiting = before_step(step)
            if waiting is not None:
                await waiting  # type: ignore[misc]
        token: int | None = rng.randrange(size)
        mask = await session.accept_or_mask(token)
        if mask is not None:
            token = _redraw(rng, mask, size)
            if token is None:
                break
            assert await session.accept(token)
        if token in eog:
            break
    return list(session.history)
