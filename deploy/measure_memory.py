# Measures the terms of the sidecar's memory for sizing (deploy/README.md, "Sizing"): a running constraintd's
# resident set when idle, after registering a vocabulary, after its first whole-vocabulary mask, after more
# compiled grammars, and after many open sessions. Prints a table; not a test.
#
#   python deploy/measure_memory.py --container NAME --target unix:///tmp/c/constraintd.sock \
#       --gguf /models/model.gguf [--schemas tests/vectors/maskbench-sample] [--grammars 10] [--sessions 2000]
#
# The server is one that runs now, either a Docker container (`--container`: its PID 1 is read with
# `docker exec`) or a local process (`--pid`). `--gguf` is the path as the *server* sees it. Each row is the
# resident set after that step; the differences are the per-vocabulary, per-grammar and per-session terms.
# Start from a fresh server: memory a process has freed is not always given back, so a second run on the
# same server reads less.
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from the repository
    sys.path.insert(0, str(ROOT))

from clients import Client, Policy  # noqa: E402

MIB = 1 << 20


def resident_reader(args: argparse.Namespace) -> Callable[[], int]:
    """A function that returns the server's resident set in bytes."""

    def status_text() -> str:
        if args.container:
            return subprocess.run(["docker", "exec", args.container, "cat", "/proc/1/status"],
                                  capture_output=True, text=True, check=True).stdout
        return Path(f"/proc/{args.pid}/status").read_text()

    def resident() -> int:
        found = re.search(r"VmRSS:\s+(\d+) kB", status_text())
        if found is None:
            raise RuntimeError("no VmRSS in the server's /proc status")
        return int(found[1]) * 1024

    return resident


def schemas(directory: Path, count: int) -> list[object]:
    """The first `count` schemas in a directory of MaskBench files ({"schema": ...}) or bare schemas."""
    found: list[object] = []
    for path in sorted(directory.glob("*.json")):
        document = json.loads(path.read_text())
        found.append(document.get("schema", document) if isinstance(document, dict) else document)
        if len(found) == count:
            break
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The sidecar's memory, term by term.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--container", help="a running Docker container of the image")
    where.add_argument("--pid", type=int, help="a local constraintd process")
    parser.add_argument("--target", required=True, help="the server's gRPC target (unix:///... or host:port)")
    parser.add_argument("--gguf", required=True, help="a GGUF path the server can read")
    parser.add_argument("--schemas", type=Path, default=ROOT / "tests" / "vectors" / "maskbench-sample")
    parser.add_argument("--grammars", type=int, default=10, help="distinct JSON schemas to compile")
    parser.add_argument("--sessions", type=int, default=2000, help="idle sessions to open")
    args = parser.parse_args(argv)
    resident = resident_reader(args)
    rows: list[tuple[str, int]] = [("idle server", resident())]
    policy = Policy(timeout=120.0, setup_timeout=600.0)
    with Client(args.target, policy=policy) as client:
        vocab = client.register_vocab(gguf=args.gguf)
        rows.append((f"vocabulary registered ({vocab.size:,} tokens)", resident()))
        first = client.session(vocab, json_object=True)
        first.mask()
        rows.append(("first whole-vocabulary mask (JSON mode)", resident()))
        compiled = 0
        for schema in schemas(args.schemas, args.grammars):
            session = client.session(vocab, json_schema=json.dumps(schema))
            session.mask()
            session.close()
            compiled += 1
        rows.append((f"{compiled} JSON schemas compiled, one mask each", resident()))
        opened = [client.session(vocab, json_object=True) for _ in range(args.sessions)]
        rows.append((f"{len(opened):,} idle sessions open", resident()))
    width = max(len(label) for label, _ in rows)
    print(f"{'step':<{width}}  {'resident MiB':>12}  {'added MiB':>10}")
    previous = rows[0][1]
    for label, value in rows:
        print(f"{label:<{width}}  {value / MIB:>12.1f}  {(value - previous) / MIB:>10.1f}")
        previous = value
    return 0


if __name__ == "__main__":
    sys.exit(main())
