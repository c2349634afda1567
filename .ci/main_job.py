"""Runs the README's main job exactly as written there, with fewer tokens, and checks what it printed.

The command is read from the README (the shell block after "**The main job**"), so the README and CI cannot
drift apart. It must exit 0 and print one JSON document whose `tokens` is a non-empty list of ints and whose
`text` is a string; anything else (a crash of the model library, a set-up that does not install what the
command needs) fails CI here with one clear line, before the tests run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 16
TIMEOUT_SECONDS = 3600  # the first set-up compiles llama.cpp


def main_job_command(readme: str) -> str:
    found = re.search(r"\*\*The main job\*\*.*?```sh\n(.*?)\n```", readme, flags=re.DOTALL)
    if found is None:
        raise SystemExit("main job: the README has no shell block after '**The main job**'")
    command = found.group(1).strip()
    if "--output json" not in command or "--max-tokens" not in command:
        raise SystemExit(f"main job: no --output json or --max-tokens in the README's command: {command}")
    return re.sub(r"--max-tokens \d+", f"--max-tokens {MAX_TOKENS}", command)


def main() -> None:
    command = main_job_command((ROOT / "README.md").read_text())
    print(f"== main job: {command}", flush=True)
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, stdout=subprocess.PIPE, timeout=TIMEOUT_SECONDS, check=False
    )
    if done.returncode != 0:
        reason = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        if done.returncode in (132, 134, 139) or done.returncode < 0:
            reason += " (the model library crashed: an instruction this CPU does not allow, or memory)"
        raise SystemExit(f"main job FAILED: {reason}")
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"main job FAILED: its output is not JSON ({exc}): {done.stdout[:400]!r}") from exc
    tokens = report.get("tokens") if isinstance(report, dict) else None
    if not (isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens)):
        raise SystemExit(f"main job FAILED: no tokens in its report: {done.stdout[:400]!r}")
    if not isinstance(report.get("text"), str):
        raise SystemExit("main job FAILED: no text in its report")
    print(f"== main job: {len(tokens)} tokens: {report['text']!r}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
