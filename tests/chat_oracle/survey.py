"""What llama.cpp's chat layer makes of every template of the reference: a table, one row per template.

    python -m tests.chat_oracle.survey            # builds the oracle on first use (see build.py)

Columns: the format llama.cpp detects without tools and with the `get_weather` tool (tool_choice auto, then
required); for the request with tools (auto): whether the grammar is lazy, its size, the triggers (count and
the first one), the preserved tokens, the thinking tags; what llama.cpp's parser makes of a plain answer with
no tool call (reasoning_format auto): content, reasoning, or refused; and how many of the cases of
tests/chat_oracle/cases.py the project's template path renders identically to llama.cpp.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.chat_oracle.build import harness_binary, run_harness
from tests.chat_oracle.cases import CASES, ChatCase, template_paths
from tests.chat_oracle.compare import compare_template

NO_TOOLS = ChatCase("system+user", tools=False)
WITH_TOOLS = ChatCase("system+user", tools=True)
PLAIN_ANSWER = "The capital is Paris."


def _parsed_as(answer: dict[str, Any]) -> str:
    if "error" in answer:
        return "refused"
    return "content" if PLAIN_ANSWER in answer["content"] else "reasoning"


def _format(answer: dict[str, Any]) -> str:
    return f"error ({answer['stage']})" if "error" in answer else str(answer["format"])


def survey_row(binary: Path, path: Path) -> dict[str, Any]:
    """llama.cpp's chat params for one template, and the prompt comparison counts."""
    source = path.read_text()
    plain = run_harness(binary, NO_TOOLS.request(source))
    auto = run_harness(binary, WITH_TOOLS.request(source, tool_choice="auto"))
    required = run_harness(binary, WITH_TOOLS.request(source, tool_choice="required"))
    plain_answer = run_harness(binary, WITH_TOOLS.request(
        source, mode="parse", text=PLAIN_ANSWER, reasoning_format="auto"))
    comparisons = compare_template(binary, path)
    row: dict[str, Any] = {
        "template": path.stem, "format": _format(plain), "format_tools": _format(auto),
        "format_required": _format(required), "plain_answer": _parsed_as(plain_answer),
        "identical": sum(c.identical for c in comparisons), "cases": len(comparisons),
    }
    if "error" not in auto:
        triggers = auto["grammar_triggers"]
        tags = [auto["thinking_start_tag"], *auto["thinking_end_tags"]]
        row.update(
            lazy=auto["grammar_lazy"], grammar_lines=len(auto["grammar"].splitlines()),
            triggers=len(triggers),
            first_trigger=f"{triggers[0]['type']}:{triggers[0]['value']!r}" if triggers else "",
            preserved=len(auto["preserved_tokens"]),
            thinking=" ".join(repr(tag)[1:-1] for tag in tags if tag),
        )
    else:
        row["error"] = auto["error"]
    return row


def main() -> int:
    binary = harness_binary()
    rows = [survey_row(binary, path) for path in template_paths()]
    header = ("template", "format", "+tools", "required", "lazy", "gbnf", "trig", "first trigger", "kept",
              "thinking", "plain answer", "prompts")
    table = [header]
    for row in rows:
        table.append((
            row["template"], row["format"], row["format_tools"], row["format_required"],
            "yes" if row.get("lazy") else "no" if "lazy" in row else "-", str(row.get("grammar_lines", "-")),
            str(row.get("triggers", "-")), row.get("first_trigger", row.get("error", ""))[:40],
            str(row.get("preserved", "-")), row.get("thinking", ""), row["plain_answer"],
            f"{row['identical']}/{row['cases']}",
        ))
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    identical = sum(row["identical"] for row in rows)
    total = sum(row["cases"] for row in rows)
    print(f"\n{len(rows)} templates, {len(CASES)} cases each: {identical} of {total} prompts identical "
          "to llama.cpp's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
