"""Kill benchmark of the client's recovery (not a test): seeded walks through repeated server kills.

    .venv/bin/python -m tests.benchmarks.bench_kills                       # 40 walks, up to 50 kills
    .venv/bin/python -m tests.benchmarks.bench_kills --walks 10 --kills 10

A walk is a seeded generation through a JSON schema over llama.cpp's llama-spm vocabulary (32,000 tokens),
the way a sampler drives constraintd (tests/clients/generation.py: draw, `accept_or_mask`, redraw on the
mask), through one blocking client. Its tokens are first computed in process, with no server to lose.
Then the walks run against a `constraintd serve` process on a Unix socket while another thread kills it
(SIGKILL) at random moments (seeded, `--every` seconds apart on average) and starts a new one on the same
socket, up to `--kills` times. Each walk's tokens are compared with its reference: the client must ride
out every kill (retrying while the server is down, registering its vocabulary again, rebuilding the
session by replay) and end with the same tokens.

Printed: walks run, identical, divergent (a silent wrong result) and failed (by error class), and the
kills that fell while walks ran.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from clients import Client, Policy  # noqa: E402
from constraintd.engine.vocab.vocab import Vocab  # noqa: E402
from constraintd.errors import ConstraintdError  # noqa: E402
from tests import reference  # noqa: E402
from tests.clients.generation import SCHEMA, generate  # noqa: E402
from tests.server.running import ServerProcess, socket_dir, wait_serving  # noqa: E402

# patient enough to ride out a restart (about a second here) at any moment of a call
POLICY = Policy(timeout=30.0, setup_timeout=60.0, attempts=40, backoff=0.05, max_backoff=0.5, rebuilds=6)


class Killer(threading.Thread):
    """Kills the server at random moments and starts a new one on the same socket."""

    def __init__(self, socket: Path, *, kills: int, every: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.socket = socket
        self.kills = kills
        self.every = every
        self.rng = random.Random(seed)
        self.servers = [ServerProcess(socket).start()]
        self.done = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while self.done < self.kills and not self.halt.wait(self.rng.uniform(0.2, 2 * self.every - 0.2)):
            self.servers[-1].kill()
            self.servers.append(ServerProcess(self.socket).launch())
            self.done += 1

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        for server in self.servers:
            server.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--walks", type=int, default=40, help="seeded walks (default 40)")
    parser.add_argument("--steps", type=int, default=40, help="tokens a walk (default 40)")
    parser.add_argument("--kills", type=int, default=50, help="the most kills (default 50)")
    parser.add_argument("--every", type=float, default=0.8, help="mean seconds between kills (default 0.8)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    path = reference.require(reference.vocab_path("llama-spm"))
    eog = frozenset(Vocab.from_gguf(path).eog_ids)
    seeds = [args.seed * 1000 + walk for walk in range(args.walks)]
    with Client("local") as local:
        vocab = local.register_vocab(gguf=path)
        expected = {
            seed: generate(local.session(vocab, json_schema=SCHEMA), seed=seed, steps=args.steps, eog=eog)
            for seed in seeds
        }
    outcomes: Counter[str] = Counter()
    started = time.monotonic()
    with socket_dir() as directory:
        killer = Killer(directory / "s.sock", kills=args.kills, every=args.every, seed=args.seed)
        wait_serving(killer.servers[0].target, server=killer.servers[0])
        killer.start()
        try:
            with Client(killer.servers[0].target, policy=POLICY) as client:
                for seed in seeds:
                    try:
                        session = client.session(client.register_vocab(gguf=path), json_schema=SCHEMA)
                        tokens = generate(session, seed=seed, steps=args.steps, eog=eog)
                        outcomes["identical" if tokens == expected[seed] else "DIVERGENT"] += 1
                    except ConstraintdError as error:
                        outcomes[f"failed: {type(error).__name__}: {str(error)[:80]}"] += 1
                    print(f"walk {seed}: {outcomes.most_common(1)[0][0]}, kills so far {killer.done}",
                          file=sys.stderr)
            kills = killer.done
        finally:
            killer.stop()
    seconds = time.monotonic() - started
    print(f"kills: {args.walks} walks of up to {args.steps} tokens (llama-spm, a JSON schema) in "
          f"{seconds:.0f} s, with {kills} SIGKILLs of the server (each followed by a new one on its socket)")
    for outcome, count in sorted(outcomes.items()):
        print(f"  {outcome}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
