"""sampler_worker.chain: the same token as llama.cpp's own sampler chain, draw after draw.

The oracle is llama.cpp's chain built with the same constructors llama-server's `common_sampler_init`
calls (tests/oracle.py `LlamaSamplerChain`), applied to the same logits. Each step draws once; when a
random "grammar" rejects the draw, both chains draw again on the masked logits with the same generator
(llama-server's `common_sampler_sample` with `grammar_first = false`); then both accept the token.

Sizes (chosen for CI; about 11,000 draws in all):
- synthetic logits: 13 settings x 5 kinds (normal, ties, extreme values, flat, one peak) x 3 vocabulary
  sizes (64, 3,000, 20,000; flat logits 8,000 at most, as a whole vocabulary of ties makes top-p sort
  all of it exactly) x 36 steps; every third step is rejected and redrawn masked (9,360 draws);
- hand-built chains (greedy, plain temperature, typical alone, temperature < 0): 200 draws;
- Gemma 3 270M logits: every position of three prompts (about 100 rows of 262,144), 6 settings.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from sampler_worker.candidates import Candidates
from sampler_worker.chain import DEFAULT_ORDER, SamplerChain, SamplerSettings
from sampler_worker.mt19937 import LLAMA_DEFAULT_SEED
from sampler_worker.penalties import Penalties
from sampler_worker.samplers import (
    Dist,
    Greedy,
    MinP,
    Temperature,
    TopK,
    TopP,
    Typical,
    fresh_top_k,
    masked_top_k,
    softmax,
)
from sampler_worker.samplers import _softmax_few as softmax_few
from tests.conftest import OracleReport
from tests.oracle import LlamaSamplerChain
from tests.sampler_worker.llama_chain import llama_steps

SETTINGS: dict[str, SamplerSettings] = {
    "llama-server-defaults": SamplerSettings(seed=1),
    "temperature-0": SamplerSettings(seed=2, temperature=0.0),
    "top-p-only": SamplerSettings(seed=3, top_k=0, min_p=0.0, temperature=1.0, top_p=0.5),
    "top-p-adaptive": SamplerSettings(seed=4, top_k=0, top_p=0.9),
    "top-k-200-bucket-sort": SamplerSettings(seed=5, top_k=200, top_p=0.8, min_keep=3),
    "top-k-1": SamplerSettings(seed=6, top_k=1),
    "typical": SamplerSettings(seed=7, top_k=100, typical_p=0.7, min_keep=1),
    "penalties": SamplerSettings(
        seed=8, penalty_last_n=16, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.5
    ),
    "min-p-unsorted": SamplerSettings(seed=9, top_k=0, top_p=1.0, min_p=0.1, temperature=1.5),
    "dynamic-temperature": SamplerSettings(seed=10, top_k=60, dynatemp_range=0.5, dynatemp_exponent=1.3),
    "logit-bias": SamplerSettings(
        seed=11, logit_bias=((3, 5.0), (7, float("-inf")), (3, 1.0), (70_000, 2.0))
    ),
    "temperature-first": SamplerSettings(seed=12, order=("temperature", "min_p", "top_k", "top_p")),
    "all-off": SamplerSettings(seed=13, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0),
}
# Not top-p with top-k off: on a flat real distribution it sorts the whole vocabulary exactly, ties
# included, which takes seconds per draw in Python (the synthetic cases cover it on smaller arrays).
GEMMA_SETTINGS = [
    "llama-server-defaults", "top-k-200-bucket-sort", "typical", "penalties", "min-p-unsorted",
    "dynamic-temperature",
]
KINDS = ["normal", "ties", "extreme", "flat", "peak"]
SIZES = [64, 3000, 20_000]
FLAT_SIZE_LIMIT = 8000
STEPS = 36
REJECT_EVERY = 3


def synthetic_logits(kind: str, n: int, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    if kind == "normal":
        return (rng.normal(size=n) * 3).astype(np.float32)
    if kind == "ties":
        return (rng.integers(-12, 12, size=n) / 2).astype(np.float32)
    if kind == "extreme":
        logits = (rng.normal(size=n) * 3).astype(np.float32)
        u = rng.random(n)
        logits[u < 0.05] = -np.inf
        logits[(u >= 0.05) & (u < 0.06)] = 1e30
        logits[(u >= 0.06) & (u < 0.08)] = -1e30
        logits[(u >= 0.08) & (u < 0.09)] = 60.0
        logits[(u >= 0.09) & (u < 0.10)] = -60.0
        logits[0] = 3e8  # just past the int range of llama.cpp's bucket index
        return logits
    if kind == "flat":
        return np.zeros(n, dtype=np.float32)
    logits = (rng.normal(size=n) * 0.5).astype(np.float32)
    logits[rng.integers(n)] = 25.0
    return logits


def run_both(
    settings: SamplerSettings, rows: list[npt.NDArray[np.float32]], rng: np.random.Generator
) -> tuple[int, int]:
    """Generate over `rows` with both chains; (identical draws, draws)."""
    n_vocab = rows[0].size
    ours = SamplerChain.from_settings(settings)
    identical = total = 0
    with LlamaSamplerChain(llama_steps(settings, n_vocab)) as theirs:
        for step, logits in enumerate(rows):
            expected, got = theirs.sample(logits), ours.sample(logits)
            identical += expected == got
            total += 1
            if step % REJECT_EVERY == REJECT_EVERY - 1:
                allowed = rng.random(n_vocab) < 0.3
                allowed[expected] = False
                allowed[rng.integers(n_vocab)] = True
                masked = np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32)
                expected, got = theirs.sample(masked), ours.sample(logits, allowed=allowed)
                identical += expected == got
                total += 1
            theirs.accept(expected)
            ours.accept(expected)
    return identical, total


@pytest.mark.oracle
@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
@pytest.mark.parametrize("name", list(SETTINGS), ids=list(SETTINGS))
def test_synthetic_logits_draw_the_same_tokens(name: str, kind: str, oracle_report: OracleReport) -> None:
    rng = np.random.default_rng([list(SETTINGS).index(name), KINDS.index(kind)])
    identical = total = 0
    for size in SIZES:
        size = min(size, FLAT_SIZE_LIMIT) if kind == "flat" else size
        rows = [synthetic_logits(kind, size, rng) for _ in range(STEPS)]
        same, count = run_both(SETTINGS[name], rows, rng)
        identical += same
        total += count
    oracle_report.add("sampled tokens", f"synthetic {name}", identical=identical, total=total)
    assert identical == total


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("name", GEMMA_SETTINGS, ids=GEMMA_SETTINGS)
def test_gemma_logits_draw_the_same_tokens(
    name: str, gemma_logits: npt.NDArray[np.float32], oracle_report: OracleReport
) -> None:
    rng = np.random.default_rng(GEMMA_SETTINGS.index(name))
    identical, total = run_both(SETTINGS[name], list(gemma_logits), rng)
    oracle_report.add("sampled tokens", f"gemma-3-270m {name}", identical=identical, total=total)
    assert identical == total


@pytest.mark.oracle
@pytest.mark.parametrize("seed", [0, 1, 2**31, 0xFFFFFFFE], ids=["0", "1", "2^31", "max-minus-1"])
def test_dist_seed_is_the_one_llama_cpp_reports(seed: int) -> None:
    with LlamaSamplerChain([("dist", (seed,))]) as theirs:
        assert Dist(seed).seed_used == theirs.seed() == seed


def test_default_seed_is_replaced_by_a_random_one() -> None:
    seeds = {Dist(LLAMA_DEFAULT_SEED).seed_used for _ in range(8)}
    assert len(seeds) > 1


@pytest.mark.oracle
def test_hand_built_chains_with_greedy_and_plain_temperature(oracle_report: OracleReport) -> None:
    rng = np.random.default_rng(77)
    n_vocab = 5000
    chains = [
        ([Penalties(8, 1.1), Greedy()], [("penalties", (n_vocab, 8, 1.1, 0.0, 0.0)), ("greedy", ())]),
        ([TopK(50), Temperature(0.7), Dist(5)], [("top_k", (50,)), ("temp", (0.7,)), ("dist", (5,))]),
        ([Typical(0.4, 0), Dist(6)], [("typical", (0.4, 0)), ("dist", (6,))]),
        ([Temperature(-1.0), Dist(7)], [("temp", (-1.0,)), ("dist", (7,))]),
    ]
    identical = total = 0
    for samplers, steps in chains:
        ours = SamplerChain(samplers)
        with LlamaSamplerChain(steps) as theirs:
            for kind in KINDS:
                for _ in range(10):
                    logits = synthetic_logits(kind, n_vocab, rng)
                    expected, got = theirs.sample(logits), ours.sample(logits)
                    identical += expected == got
                    total += 1
                    theirs.accept(expected)
                    ours.accept(expected)
    oracle_report.add("sampled tokens", "synthetic hand-built chains", identical=identical, total=total)
    assert identical == total


@pytest.mark.oracle
def test_candidates_left_by_the_chain_are_llama_cpps(oracle_report: OracleReport) -> None:
    # Not only the token: the ids, logits and probabilities the chain leaves, bit for bit.
    rng = np.random.default_rng(99)
    identical = total = 0
    for name in ["llama-server-defaults", "typical", "top-k-200-bucket-sort", "min-p-unsorted"]:
        settings = SETTINGS[name]
        for kind in KINDS:
            logits = synthetic_logits(kind, 3000, rng)
            ours = SamplerChain.from_settings(settings)
            with LlamaSamplerChain(llama_steps(settings, logits.size)) as theirs:
                data, selected = theirs.apply(logits)
            cur = Candidates.from_logits(logits)
            ours.apply(cur)
            same = (
                selected == cur.selected
                and np.array_equal(data["id"], cur.ids)
                and np.array_equal(data["logit"].view(np.uint32), cur.logits.view(np.uint32))
                and np.array_equal(data["p"].view(np.uint32), cur.probs.view(np.uint32))
            )
            identical += same
            total += 1
    oracle_report.add("candidate arrays", "synthetic", identical=identical, total=total)
    assert identical == total


def _common_h(llama_cpp_dir: Path) -> str:
    text = (llama_cpp_dir / "common" / "common.h").read_text()
    start = text.index("struct common_params_sampling {")
    return text[start : text.index("\n};", start)]


@pytest.mark.parametrize(
    ("field", "attribute"),
    [("top_k", "top_k"), ("top_p", "top_p"), ("min_p", "min_p"), ("typ_p", "typical_p"),
     ("temp", "temperature"),
     ("dynatemp_range", "dynatemp_range"), ("dynatemp_exponent", "dynatemp_exponent"),
     ("penalty_last_n", "penalty_last_n"), ("penalty_repeat", "repeat_penalty"),
     ("penalty_freq", "frequency_penalty"), ("penalty_present", "presence_penalty"), ("min_keep", "min_keep"),
     ("dry_multiplier", "dry_multiplier"), ("xtc_probability", "xtc_probability"),
     ("top_n_sigma", "top_n_sigma"), ("mirostat", "mirostat")],
    ids=lambda value: str(value),
)
def test_defaults_are_llama_servers(field: str, attribute: str, llama_cpp_dir: Path) -> None:
    match = re.search(rf"\b{field}\s*=\s*(-?[0-9.]+)f?;", _common_h(llama_cpp_dir))
    assert match is not None, field
    assert getattr(SamplerSettings(), attribute) == pytest.approx(float(match.group(1)))


def test_default_seed_and_order_are_llama_servers(llama_cpp_dir: Path) -> None:
    struct = _common_h(llama_cpp_dir)
    assert re.search(r"uint32_t seed\s*=\s*LLAMA_DEFAULT_SEED;", struct)
    listed = re.search(r"samplers\s*=\s*\{(.*?)\}", struct, re.DOTALL)
    assert listed is not None
    names = re.findall(r"COMMON_SAMPLER_TYPE_(\w+)", listed.group(1))
    spelled = {"TYPICAL_P": "typ_p"}
    assert tuple(spelled.get(name, name.lower()) for name in names) == DEFAULT_ORDER
    assert SamplerSettings().order == DEFAULT_ORDER
    assert SamplerSettings().seed == LLAMA_DEFAULT_SEED


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (SamplerSettings(repeat_penalty=0.0), "penalty_repeat"),
        (SamplerSettings(repeat_penalty=float("inf")), "penalty_repeat"),
        (SamplerSettings(repeat_penalty=1e-45), "penalty_repeat"),
        (SamplerSettings(frequency_penalty=float("nan")), "penalty_freq"),
        (SamplerSettings(presence_penalty=float("-inf")), "penalty_present"),
        (SamplerSettings(order=("top_k", "nucleus")), "unknown sampler"),
        (SamplerSettings(dry_multiplier=0.8), "dry_multiplier"),
        (SamplerSettings(xtc_probability=0.5), "xtc_probability"),
        (SamplerSettings(top_n_sigma=1.0), "top_n_sigma"),
        (SamplerSettings(mirostat=2), "mirostat"),
    ],
    ids=["repeat-zero", "repeat-inf", "repeat-inverse-inf", "freq-nan", "present-inf", "unknown-name", "dry",
         "xtc", "top-n-sigma", "mirostat"],
)
def test_refused_settings(settings: SamplerSettings, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplerChain.from_settings(settings)


def test_chain_refuses_nan_and_positive_infinity() -> None:
    chain = SamplerChain.from_settings(SamplerSettings(seed=1))
    for bad in (np.nan, np.inf):
        logits = np.zeros(10, dtype=np.float32)
        logits[3] = bad
        with pytest.raises(ValueError, match="finite"):
            chain.sample(logits)


def test_mask_of_the_wrong_size_is_refused() -> None:
    chain = SamplerChain.from_settings(SamplerSettings(seed=1))
    with pytest.raises(ValueError, match="mask"):
        chain.sample(np.zeros(10, dtype=np.float32), allowed=np.ones(9, dtype=bool))
    with pytest.raises(ValueError, match="mask"):
        chain.sample(np.zeros(10, dtype=np.float32), allowed_ids=np.array([3, 10]))
    with pytest.raises(ValueError, match="not both"):
        chain.sample(np.zeros(10, dtype=np.float32), allowed=np.ones(10, dtype=bool),
                     allowed_ids=np.arange(10))


def test_a_mask_by_ids_refuses_nan_among_the_allowed_and_overwrites_the_rejected() -> None:
    chain = SamplerChain.from_settings(SamplerSettings(seed=1))
    logits = np.zeros(300, dtype=np.float32)
    logits[7] = np.nan  # rejected: -inf whatever it was, as llama.cpp's grammar sampler sets it
    assert chain.sample(logits, allowed_ids=np.array([5, 200])) in (5, 200)
    with pytest.raises(ValueError, match="finite"):
        chain.sample(logits, allowed_ids=np.array([7, 200]))
    logits[5], logits[200] = 1.0, 2.0  # distinct: the few allowed are drawn on alone (`_sample_few`)
    for bad in (np.nan, np.inf):
        logits[7] = bad
        greedy = SamplerChain.from_settings(SamplerSettings(seed=1, temperature=0.0))
        with pytest.raises(ValueError, match="finite"):
            greedy.sample(logits, allowed_ids=np.array([5, 7, 200]))


def test_masked_draw_only_picks_allowed_tokens() -> None:
    chain = SamplerChain.from_settings(SamplerSettings(seed=1, top_k=0, top_p=1.0, min_p=0.0))
    rng = np.random.default_rng(3)
    for _ in range(50):
        logits = rng.normal(size=500).astype(np.float32)
        allowed = rng.random(500) < 0.05
        allowed[0] = True
        assert allowed[chain.sample(logits, allowed=allowed)]


def full_masked_draw(
    chain: SamplerChain, logits: npt.NDArray[np.float32], allowed: npt.NDArray[np.bool_]
) -> int:
    # The masked draw over the whole vocabulary, as llama.cpp makes it (no reading of the allowed alone).
    cur = Candidates.from_logits(logits)
    cur.logits[~allowed] = -np.inf
    chain.apply(cur)
    return cur.token


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
@pytest.mark.parametrize("name", list(SETTINGS), ids=list(SETTINGS))
def test_a_masked_draw_reading_the_allowed_alone_draws_as_over_all(name: str, kind: str) -> None:
    # A masked draw whose chain begins with top-k reads the first k tokens and the allowed ones past
    # them; every kind of logits (ties, -inf, extremes) and masks from a handful of tokens to most of the
    # vocabulary, against the draw over the whole masked vocabulary.
    rng = np.random.default_rng(sum(map(ord, name + kind)))
    settings = SETTINGS[name]
    fast, full = SamplerChain.from_settings(settings), SamplerChain.from_settings(settings)
    by_ids = SamplerChain.from_settings(settings)  # the mask given as the allowed tokens' ids
    n = 3000
    for step in range(60):
        logits = synthetic_logits(kind, n, rng)
        allowed = rng.random(n) < [0.002, 0.02, 0.3, 0.9][step % 4]
        allowed[rng.integers(n)] = True
        expected = full_masked_draw(full, logits, allowed)
        assert fast.sample(logits, allowed=allowed) == expected
        assert by_ids.sample(logits, allowed_ids=np.flatnonzero(allowed)) == expected
        for chain in (fast, full, by_ids):
            chain.accept(expected)


def test_top_k_of_the_first_k_and_the_allowed_past_them_is_top_k_of_the_masked_vocabulary() -> None:
    rng = np.random.default_rng(5)
    for trial in range(400):
        n, k = 2000, int(rng.choice([1, 5, 40, 128]))
        logits = synthetic_logits(KINDS[trial % len(KINDS)], n, rng)
        allowed = rng.random(n) < [0.001, 0.01, 0.05, 0.5, 0.99][trial % 5]
        got = masked_top_k(logits, np.flatnonzero(allowed), k)
        assert got is not None
        whole = Candidates.from_logits(logits)
        whole.logits[~allowed] = -np.inf
        TopK(k).apply(whole)
        assert got.ids.tolist() == whole.ids.tolist()
        assert got.logits.tobytes() == whole.logits.tobytes()
        assert got.is_sorted and whole.is_sorted
    assert masked_top_k(np.zeros(300, dtype=np.float32), np.arange(300), 129) is None  # buckets


def test_top_k_read_off_fresh_logits_is_top_k_of_every_candidate() -> None:
    # A first draw's top-k without the whole vocabulary's candidates: where it answers, the candidates
    # TopK leaves of them, bit for bit; it declines only where the k highest are not distinct and above
    # the rest (then the chain sorts them all, as test_chain_matches_llama_cpp checks).
    rng = np.random.default_rng(7)
    declined = 0
    for trial in range(300):
        n, k = int(rng.choice([100, 3000, 40_000])), int(rng.choice([1, 5, 40, 128, 200]))
        logits = synthetic_logits(KINDS[trial % len(KINDS)], n, rng)
        got = fresh_top_k(logits, k)
        whole = Candidates.from_logits(logits)
        TopK(k).apply(whole)
        if got is None:
            declined += 1
            if k >= n:
                continue
            kept = np.sort(logits)[::-1][: k + 1]
            assert kept[k - 1] == kept[k] or len(set(kept[:k].tolist())) < k
            continue
        assert got.ids.tolist() == whole.ids.tolist()
        assert got.logits.tobytes() == whole.logits.tobytes()
        assert got.probs.tobytes() == whole.probs.tobytes()
        assert got.is_sorted and whole.is_sorted
    assert declined < 200  # "normal" and "peak" logits are answered
    assert fresh_top_k(np.zeros(10, dtype=np.float32), 10) is None  # k covers the vocabulary


def test_a_redraw_of_few_allowed_tokens_runs_on_them_alone_and_draws_as_over_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A chain that begins with top-k (k <= 128) redraws from a mask of a few finite logits on those alone
    # (`_sample_few`). Random settings around the edges of each sampler after top-k (a top-p just under 1,
    # min_keep past the head, temperature 0 and one that overflows float32, every order) and masks of 1
    # to 80 tokens (more than k, and past _FEW_CANDIDATES), some -inf, tied or extreme, each draw against
    # the whole masked vocabulary on a twin chain: the same tokens, and the same generator after each.
    answered = declined = 0
    real = SamplerChain._sample_few

    def counted(
        self: SamplerChain, read: npt.NDArray[np.float32], ids: npt.NDArray[np.integer]
    ) -> int | None:
        nonlocal answered, declined
        token = real(self, read, ids)
        answered += token is not None
        declined += token is None
        return token

    monkeypatch.setattr(SamplerChain, "_sample_few", counted)
    rng = np.random.default_rng(2026)
    n = 500
    for case in range(120):
        later = ["top_p", "min_p", "temperature", "typ_p"][: 3 + (case % 10 == 0)]
        rng.shuffle(later)
        settings = SamplerSettings(
            seed=case,
            top_k=int(rng.choice([1, 2, 5, 40, 128])),
            top_p=float(rng.choice([0.3, 0.95, 0.99999994, 1.0])),
            min_p=float(rng.choice([0.0, 0.05, 0.5])),
            min_keep=int(rng.choice([0, 1, 3, 20])),
            temperature=float(rng.choice([0.0, 0.8, 1.0, 3.0, 1e-38])),
            typical_p=0.7,
            order=("top_k", *later),
        )
        few, full = SamplerChain.from_settings(settings), SamplerChain.from_settings(settings)
        for _ in range(8):
            logits = (rng.normal(size=n) * 3).astype(np.float32)
            size = int(rng.integers(1, 17) if rng.random() < 0.5 else rng.integers(17, 81))
            ids = np.sort(rng.choice(n, size=size, replace=False))
            kind = rng.integers(6)
            if kind == 1:
                logits[ids[rng.random(ids.size) < 0.5]] = -np.inf
            elif kind == 2:
                logits[ids] = np.float32(rng.integers(-2, 2, size=ids.size))
            elif kind == 3:
                logits[ids[0]] = np.float32(1e30)
            elif kind == 4:
                logits[ids[-1]] = np.float32(-1e30)
            if np.isneginf(logits[ids]).all():
                logits[ids[0]] = 0.0
            allowed = np.zeros(n, dtype=np.bool_)
            allowed[ids] = True
            with np.errstate(over="ignore"):  # the whole chain's numpy division by 1e-38
                assert few.sample(logits, allowed_ids=ids) == full_masked_draw(full, logits, allowed)
        assert few.samplers[-1].rng.uniform() == full.samplers[-1].rng.uniform()  # type: ignore[attr-defined]
    assert answered > 500 and declined > 100, (answered, declined)


def test_each_sampler_on_few_candidates_leaves_what_it_leaves_of_them_as_an_array() -> None:
    # On a head without a tail (sorted, distinct, finite), `apply_few` against `apply` bit for bit: the
    # probabilities, the logits kept, and dist's position and generator. Heads of 1 to 128 logits (the
    # softmax goes by numpy past 16) of every spread, near-equal ones included, so that float32 sums and
    # cuts fall on their last bit.
    rng = np.random.default_rng(44)
    for case in range(400):
        size = int(rng.integers(1, 17) if case % 2 else rng.integers(17, 129))
        scale = float(rng.choice([1e-3, 0.05, 1.0, 8.0, 40.0]))
        values = np.unique((rng.normal(size=size) * scale).astype(np.float32))[::-1]
        head = values.tolist()
        cur = Candidates(np.arange(values.size, dtype=np.int32), values.copy(), is_sorted=True)
        softmax(cur, do_sort=False)
        assert softmax_few(head) == cur.probs.tolist()
        min_keep = int(rng.choice([0, 1, 3, 20]))
        samplers = [
            TopP(float(rng.choice([0.3, 0.9, 0.95, 0.99999994])), min_keep),
            MinP(float(rng.choice([0.01, 0.05, 0.5])), min_keep),
            Temperature(float(rng.choice([0.0, 0.7, 1.3]))),
        ]
        for sampler in samplers:
            cur = Candidates(np.arange(values.size, dtype=np.int32), values.copy(), is_sorted=True)
            sampler.apply(cur)
            kept = sampler.apply_few(head)
            assert kept is not None
            if isinstance(sampler, Temperature) and sampler.temperature <= 0.0:
                assert kept == cur.logits[:1].tolist() and np.isneginf(cur.logits[1:]).all()
            else:
                assert kept == cur.logits.tolist(), type(sampler).__name__
        few, whole = Dist(case), Dist(case)
        cur = Candidates(np.arange(values.size, dtype=np.int32), values.copy(), is_sorted=True)
        whole.apply(cur)
        assert few.select_few(head) == cur.selected
        assert few.rng.uniform() == whole.rng.uniform()
    # min-p's bar is a float32 sum: a logit just on it is kept, one float32 step below is not
    min_p = MinP(0.05)
    for top in np.linspace(-3, 3, 61, dtype=np.float32):
        bar = np.float32(top + min_p._log_p)
        for logit in (bar, np.nextafter(bar, np.float32(-np.inf))):
            cur = Candidates(np.arange(2, dtype=np.int32), np.array([top, logit], np.float32), is_sorted=True)
            min_p.apply(cur)
            assert min_p.apply_few([float(top), float(logit)]) == cur.logits.tolist()
