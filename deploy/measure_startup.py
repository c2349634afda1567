# Measures what prepared vocabularies (`constraintd warm`, the image's WARM_VOCAB) save when a sidecar starts
# (deploy/README.md, "Prepared caches"). Prints a table; not a test.
#
#   python deploy/measure_startup.py --gguf /path/to/model.gguf [--runs 3]
#
# Three ways of starting, each a fresh `constraintd serve` process on a temporary Unix socket, taken in turn
# `--runs` times:
#   no cache        no --cache-dir: the vocabulary is read from the GGUF, its tables built at the first mask;
#   empty cache     --cache-dir on an empty directory: read, built and saved at registration (a first start);
#   prepared cache  --cache-dir on a directory `constraintd warm` filled: loaded.
# Per start, seconds from launching the process until: its socket answers (`serving`), RegisterVocab by
# GGUF path returns (`registered`), and the first whole-vocabulary mask of a JSON-mode session returns
# (`first mask`). The medians are printed. `first mask` is the time a worker waits before its first
# constrained token.
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from the repository
    sys.path.insert(0, str(ROOT))

from clients import Client, Policy  # noqa: E402

POLL = 0.005  # seconds between looks for the socket


def one_start(gguf: Path, cache_dir: Path | None, work: Path) -> tuple[float, float, float]:
    """Seconds to serving, to registered, to the first mask, for one fresh server process."""
    socket = work / f"s{time.monotonic_ns()}.sock"
    command = [sys.executable, "-m", "constraintd", "serve", "--listen", f"unix://{socket}",
               "--log-format", "text", "--log-level", "WARNING",
               "--gguf-dir", str(gguf.resolve().parent)]  # fmt: skip
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    started = time.perf_counter()
    server = subprocess.Popen(command, cwd=ROOT)
    try:
        while not socket.exists():
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            time.sleep(POLL)
        serving = time.perf_counter() - started
        with Client(f"unix://{socket}", policy=Policy(timeout=120.0, setup_timeout=600.0)) as client:
            vocab = client.register_vocab(gguf=str(gguf))
            registered = time.perf_counter() - started
            client.session(vocab, json_object=True).mask()
            first_mask = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    return serving, registered, first_mask


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What a prepared vocabulary saves at a sidecar's start.")
    parser.add_argument("--gguf", type=Path, required=True, help="a GGUF file (its vocabulary counts)")
    parser.add_argument("--runs", type=int, default=3, help="starts per way (the median is printed)")
    args = parser.parse_args(argv)
    gguf = args.gguf.resolve()
    rows: list[tuple[str, list[tuple[float, float, float]]]] = []
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        prepared = work / "prepared"
        subprocess.run([sys.executable, "-m", "constraintd", "warm", "--cache-dir", str(prepared),
                        "--vocab", str(gguf)], cwd=ROOT, check=True, capture_output=True)  # fmt: skip
        rows = [("no cache", []), ("empty cache", []), ("prepared cache", [])]
        for run in range(args.runs):  # the three in turn, so a change in the machine's load hits all alike
            rows[0][1].append(one_start(gguf, None, work))
            rows[1][1].append(one_start(gguf, work / f"empty{run}", work))
            rows[2][1].append(one_start(gguf, prepared, work))
    print(f"{gguf.name}, median of {args.runs} starts, seconds from launching the server process")
    print(f"{'start':<15} {'serving':>8} {'registered':>11} {'first mask':>11}")
    for label, times in rows:
        medians = [statistics.median(run[i] for run in times) for i in range(3)]
        print(f"{label:<15} {medians[0]:>8.2f} {medians[1]:>11.2f} {medians[2]:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
