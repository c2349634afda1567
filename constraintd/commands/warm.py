"""Prepare the engine's caches for GGUF vocabularies ahead of time, in a directory `serve --cache-dir` reads.

    constraintd warm --cache-dir DIR --vocab GGUF [--vocab GGUF ...]

For each GGUF file, its vocabulary (read as llama.cpp reads it) and the decoded tables whole-vocabulary
masks walk are saved in DIR, one file per vocabulary, and the file's metadata is linked to it. A server
started with `--cache-dir DIR` then loads them when the vocabulary is registered instead of building
them, whatever path the model is mounted at (deploy/README.md has the times). A vocabulary already
prepared in DIR is loaded (and so checked), not built again; a stale or damaged one is built again.

Progress goes to standard error. Exit status: 0 when every vocabulary is prepared; 1 when one cannot be
read or DIR cannot be written (the others are still prepared); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from constraintd.errors import VocabError
from constraintd.service.vocab_store import VocabStore

PROG = "constraintd warm"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir", metavar="DIR", type=Path, required=True, help="where to save (created if missing)"
    )
    parser.add_argument(
        "--vocab",
        metavar="GGUF",
        action="append",
        required=True,
        help="a GGUF file whose vocabulary to prepare; repeat for several",
    )


def run(args: argparse.Namespace) -> int:
    store = VocabStore([args.cache_dir])
    failed = 0
    for path in args.vocab:
        name = os.path.basename(path)
        print(f"{name}: preparing", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            opened = store.open_gguf(path)
        except VocabError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            failed += 1
            continue
        seconds = time.perf_counter() - started
        for note in opened.notes:
            print(f"{name}: {note}", file=sys.stderr)
        size = f"{len(opened.vocab)} tokens"
        if opened.loaded_from is not None:
            print(f"{name}: {size}, already prepared: loaded from {opened.loaded_from} in {seconds:.2f} s",
                  file=sys.stderr)  # fmt: skip
        elif opened.saved_to is not None:
            print(f"{name}: {size}, read and prepared in {seconds:.2f} s, saved to {opened.saved_to}",
                  file=sys.stderr)  # fmt: skip
        else:
            print(f"{PROG}: {name}: not saved in {args.cache_dir}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0
