# A template's thinking tags, found as llama.cpp's chat auto-parser finds them (common/chat-diff-analyzer.cpp,
# its first phase, analyze_reasoning, and the known-template patches that touch reasoning).
#
# Contract:
# - `analyze_reasoning(source, render, supports_tool_calls)` renders the template on llama.cpp's probe
#   conversations (its own texts: a user message, an answer with and without reasoning_content, thinking
#   on and off, a tool call with reasoning) and reads the markers around the reasoning from where the
#   renderings differ: the mode (none, tag-based, tools-only), the start tag (may be empty: a delimiter
#   style) and the end tag, whitespace included, as the analysis leaves them (the patches of known
#   templates come after every phase: template_analysis.py).
# - The probes are rendered as common_chat_template_direct_apply renders them: the messages as given (content
#   null stays null, arguments stay objects), only the content normalised to the template's string or typed
#   form, `enable_thinking` and no date variables; a probe the template refuses gives no answer.
# - The marker matches are the analysis's own small PEG parsers (a marker is `<...>` or `[...]`, spaces are
#   C's), tried at every position of the text in turn, written here as the regular expressions they are.
# - Not done here: the content, tool-call and role markers of the later phases (preserved tokens and tool
#   grammars need them).
from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from constraintd.engine.chat.analysis.diff_split import (
    C_SPACE,
    Render,
    VariantDiff,
    compare_variants,
    prune_whitespace,
    segments,
    trim_whitespace,
)
from constraintd.engine.chat.templates.template_inputs import TemplateCaps, _normalize_content

__all__ = [
    "MARKER", "SPACE", "Probe", "ReasoningAnalysis", "ReasoningMode", "analyze_reasoning", "probe_tools",
    "tool_call",
]

# llama.cpp's probe texts (chat-diff-analyzer.cpp): distinctive, so that a diff finds them
FUN_FIRST = "FFF_FIRST_FUN_F"
FUN_SECOND = "SSS_SECOND_FUN_S"
ARG_FIRST = "AA_ARG_FST_AA"
ARG_SECOND = "BB_ARG_SND_BB"
USER_MSG = "U_USER_MSG Hello END_U"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"
THINKING_CONTENT = "REASON_PART I am thinking END_R"
CALL_ID_001 = "call00001"


def _params_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            ARG_FIRST: {"type": "string", "description": "First argument"},
            ARG_SECOND: {"type": "string", "description": "Second argument"},
        },
        "required": [],
    }


def probe_tools() -> list[dict[str, Any]]:
    """The two tools of llama.cpp's probes."""
    return [
        {"type": "function", "function": {"name": FUN_FIRST, "description": "Test function foo",
                                          "parameters": _params_schema()}},
        {"type": "function", "function": {"name": FUN_SECOND, "description": "Test function bar",
                                          "parameters": _params_schema()}},
    ]


def tool_call(name: str, arguments: dict[str, Any], call_id: str = CALL_ID_001) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class ReasoningMode(enum.Enum):
    """How a template shows reasoning (llama.cpp's reasoning_mode)."""

    NONE = "none"
    TAG_BASED = "tag_based"  # <think>...</think>, or a delimiter-style end only
    TOOLS_ONLY = "tools_only"  # reasoning rendered only on turns that call tools


@dataclass(slots=True)
class ReasoningAnalysis:
    """What the analysis found: the mode and the tags, whitespace as rendered."""

    mode: ReasoningMode = ReasoningMode.NONE
    start: str = ""
    end: str = ""


class Probe:
    """Renders llama.cpp's probe conversations on one template (common_chat_template_direct_apply)."""

    def __init__(self, render: Render, caps: TemplateCaps, bos_token: str, eos_token: str) -> None:
        self.render = render
        self.caps = caps
        self.bos_token = bos_token
        self.eos_token = eos_token

    def context(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = False, enable_thinking: bool = True) -> dict[str, Any]:
        context: dict[str, Any] = {
            "messages": _normalize_content([dict(m) for m in messages], self.caps),
            "bos_token": self.bos_token, "eos_token": self.eos_token, "enable_thinking": enable_thinking,
        }
        if tools:
            context["tools"] = tools
        if add_generation_prompt:
            context["add_generation_prompt"] = True
        return context

    def compare(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> VariantDiff | None:
        return compare_variants(self.render, a, b)


SPACE = f"[{re.escape(C_SPACE)}]*"
"""The analysis's space parser: C whitespace, as much as there is."""
MARKER = r"(?:<[^>]*>|\[[^\]]*\])"
"""The analysis's marker parser: `<` up to the first `>`, or `[` up to the first `]`."""


def _first_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    # parse_anywhere_and_extract: the parser tried at each position in turn; the first success wins
    return pattern.search(text)


def _literal(text: str) -> str:
    return re.escape(text)


def _reasoning_presence(probe: Probe, found: ReasoningAnalysis) -> None:
    user = {"role": "user", "content": USER_MSG}
    plain = {"role": "assistant", "content": ASSISTANT_MSG}
    reasoned = {"role": "assistant", "content": ASSISTANT_MSG, "reasoning_content": THINKING_CONTENT}
    compared = probe.compare(probe.context([user, plain]), probe.context([user, reasoned]))
    if compared is None or not compared.diff.right or THINKING_CONTENT not in compared.diff.right:
        return
    # wrapped: marker + space, the reasoning, space + marker + space (then anything)
    wrapped = re.compile(f"(?P<pre>{MARKER}{SPACE}){_literal(THINKING_CONTENT)}"
                         f"(?P<post>{SPACE}{MARKER}{SPACE})", re.DOTALL)
    match = _first_match(wrapped, compared.output_b)
    if match is None:
        # delimiter: the reasoning, space, then a marker + space if there is one
        delimiter = re.compile(f"{_literal(THINKING_CONTENT)}{SPACE}(?P<post>{MARKER}{SPACE})?", re.DOTALL)
        match = _first_match(delimiter, compared.output_b)
    if match is None:
        return
    pre = match.groupdict().get("pre") or ""
    post = match.group("post") or ""
    if pre and post:
        found.mode, found.start, found.end = ReasoningMode.TAG_BASED, pre, post
    elif post:
        found.mode, found.end = ReasoningMode.TAG_BASED, post


def _tail_anchored(output_a: str, output_b: str, found: ReasoningAnalysis) -> None:
    # one rendering's last 64 characters found in the other, followed by exactly two markers
    anchor_len = 64
    for base, extended in ((output_b, output_a), (output_a, output_b)):
        size = min(len(base), anchor_len)
        anchor = base[len(base) - size:]
        at = extended.rfind(anchor)
        if at < 0 or at + size >= len(extended):
            continue
        extra = trim_whitespace(extended[at + size:])
        if not extra:
            continue
        parts = prune_whitespace(segments(extra))
        if len(parts) == 2 and parts[0].marker and parts[1].marker:
            if not found.start:
                found.start = parts[0].value
            if not found.end:
                found.end = parts[1].value
            found.mode = ReasoningMode.TAG_BASED
            break


def _thinking_enabled(probe: Probe, found: ReasoningAnalysis) -> None:
    user = {"role": "user", "content": USER_MSG}
    compared = probe.compare(
        probe.context([user], add_generation_prompt=True, enable_thinking=False),
        probe.context([user], add_generation_prompt=True, enable_thinking=True))
    if compared is None:
        return
    diff = compared.diff
    left, right = trim_whitespace(diff.left), trim_whitespace(diff.right)
    if not left and diff.right:
        if right and compared.output_b.endswith(right) and not found.start:
            found.start = diff.right
            found.mode = ReasoningMode.TAG_BASED
    elif not right and diff.left:
        if left and compared.output_a.endswith(left) and not found.end:
            parts = prune_whitespace(segments(compared.output_a))
            if len(parts) >= 2 and parts[-1].value == left and parts[-2].marker:
                found.start = parts[-2].value
            found.end = diff.left
            found.mode = ReasoningMode.TAG_BASED
    elif left and right:
        _tail_anchored(compared.output_a, compared.output_b, found)
    if found.mode is ReasoningMode.NONE and not found.start and found.end:
        found.mode = ReasoningMode.TAG_BASED


def _reasoning_scope(probe: Probe, found: ReasoningAnalysis) -> None:
    user = {"role": "user", "content": USER_MSG}
    with_content = {"role": "assistant", "content": ASSISTANT_MSG, "reasoning_content": THINKING_CONTENT}
    with_tools = {"role": "assistant", "content": None, "reasoning_content": THINKING_CONTENT,
                  "tool_calls": [tool_call(FUN_FIRST, {ARG_FIRST: "VVVV", ARG_SECOND: "XXXX"})]}
    tools = probe_tools()
    compared = probe.compare(probe.context([user, with_content], tools=tools),
                             probe.context([user, with_tools], tools=tools))
    if compared is None:
        return
    if THINKING_CONTENT in compared.output_a or THINKING_CONTENT not in compared.output_b:
        return
    found.mode = ReasoningMode.TOOLS_ONLY
    wrapped = re.compile(f"(?P<pre>{MARKER}{SPACE}){_literal(THINKING_CONTENT)}{SPACE}"
                         f"(?P<post>{MARKER}{SPACE})", re.DOTALL)
    match = _first_match(wrapped, compared.output_b)
    if match is not None:
        found.start, found.end = match.group("pre"), match.group("post")
        return
    delimiter = re.compile(f"{_literal(THINKING_CONTENT)}{SPACE}(?P<post>{MARKER}{SPACE})?", re.DOTALL)
    match = _first_match(delimiter, compared.output_b)
    if match is not None:
        found.end = match.group("post") or ""
    else:
        found.mode = ReasoningMode.NONE


def analyze_reasoning(probe: Probe, *, supports_tool_calls: bool) -> ReasoningAnalysis:
    """The template's reasoning markers as llama.cpp's auto-parser's first phase finds them, before the
    patches of known templates (template_analysis.py applies those). A template that refuses the probes has
    no reasoning."""
    found = ReasoningAnalysis()
    _reasoning_presence(probe, found)
    _thinking_enabled(probe, found)
    if supports_tool_calls:
        _reasoning_scope(probe, found)
    return found
