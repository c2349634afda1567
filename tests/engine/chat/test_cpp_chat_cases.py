"""The project's message parser beside llama.cpp's on llama.cpp's own chat-parser test cases.

The cases are read from the pinned llama.cpp's tests/test-chat.cpp by tests/chat_oracle/cpp_cases.py (its
peg_tester `.test(text)...run()` calls: the template, the text and the request settings; see that module
for the forms it reads and skips). Each text is parsed whole by both sides: llama.cpp's harness
("parse" mode: common_chat_parse with the parser params llama-server derives) and the project's
`parse_message` on its own chat params (constraintd.chat_templates.chat_grammar_of). The messages compared:
content, reasoning content, tool calls (name, arguments, id), or both sides refusing. llama.cpp's expected
values in test-chat.cpp are not used: the two implementations are compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from constraintd.chat_templates import chat_grammar_of, chat_prompt_of, template_caps
from constraintd.engine.chat.chat_params import NotPorted
from constraintd.engine.chat.message_parser import MessageParseError, parse_message
from constraintd.engine.chat.prompt import template_source
from constraintd.engine.chat.template_inputs import parse_messages, parse_tools
from tests import reference
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cpp_cases import CppCase, cases_by_template, cpp_cases, skipped_calls
from tests.conftest import OracleReport

pytestmark = pytest.mark.oracle

BY_TEMPLATE = cases_by_template()
# test-chat.cpp's peg_test_case default: one user message
USER_MESSAGE = [{"role": "user", "content": "Hey there!"}]
NOW = 1_700_000_000

# Where the project's parser does not give llama.cpp's message: (template, test-chat.cpp line) -> why. Every
# other case gives the same message, and a listed case that becomes identical fails the test too.
NOT_PORTED_CALL_ID = ("the project's parser refuses (NotPorted: the tag formats' argument markers and atomic "
                      "function names) a Mistral call with a call id: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}")
EXPECTED_DIFFERENCES: dict[tuple[str, int], str] = {
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", 6254): NOT_PORTED_CALL_ID,  # one call
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", 6260): NOT_PORTED_CALL_ID,  # two calls, parallel
}


def _llama(case: CppCase, source: str, binary: Path) -> dict[str, Any]:
    request: dict[str, Any] = {
        "mode": "parse", "template": source, "bos_token": "", "eos_token": "", "messages": USER_MESSAGE,
        "tool_choice": case.tool_choice, "parallel_tool_calls": case.parallel_tool_calls, "now": NOW,
        "reasoning_format": case.reasoning_format, "enable_thinking": case.enable_thinking, "text": case.text,
    }
    if case.tools:
        request["tools"] = list(case.tools)
    if case.json_schema is not None:
        request["json_schema"] = case.json_schema
    answer = run_harness(binary, request)
    if "error" in answer:
        return {"error": answer["stage"]}
    return {"content": answer["content"], "reasoning_content": answer["reasoning_content"],
            "tool_calls": [[c["name"], c["arguments"], c["id"]] for c in answer["tool_calls"]]}


def _ours(case: CppCase, source: str) -> dict[str, Any]:
    messages = parse_messages(USER_MESSAGE)
    tools = parse_tools(list(case.tools) or None)
    try:
        prompt = chat_prompt_of(source, messages, tools=tools, enable_thinking=case.enable_thinking, now=NOW)
        grammar = chat_grammar_of(
            source, messages, tools=tools, tool_choice=case.tool_choice, json_schema=case.json_schema,
            reasoning_format=case.reasoning_format, enable_thinking=case.enable_thinking, now=NOW,
            parallel_tool_calls=case.parallel_tool_calls, generation_prompt=prompt.generation_prompt)
        message = parse_message(
            case.text, grammar, generation_prompt=prompt.generation_prompt,
            tools=[tool.to_json() for tool in tools], tool_choice=case.tool_choice,
            parallel_tool_calls=case.parallel_tool_calls, reasoning_format=case.reasoning_format,
            supports_tool_calls=template_caps(template_source(source)).supports_tool_calls,
            has_response_format=case.json_schema is not None)
    except MessageParseError:
        return {"error": "parse"}
    except NotPorted as exc:
        return {"not ported": str(exc)}
    return {"content": message.content, "reasoning_content": message.reasoning_content,
            "tool_calls": [[c.name, c.arguments, c.id] for c in message.tool_calls]}


def test_cases_are_read() -> None:
    # the reader finds the peg_tester cases of every template test-chat.cpp names with a literal path
    assert (len(cpp_cases()), len(BY_TEMPLATE)) == (315, 53)  # as tests/chat_oracle/cpp_cases.py says
    assert skipped_calls() == {"messages(...)": 72, "a tester whose template is a variable": 19,
                               "a text that is not string literals": 11, "is_partial(...)": 6,
                               "tools that are not named definitions": 2}
    assert {template for template, _ in EXPECTED_DIFFERENCES} <= set(BY_TEMPLATE)


@pytest.mark.parametrize("template", sorted(BY_TEMPLATE), ids=[name.removesuffix(".jinja")
                                                               for name in sorted(BY_TEMPLATE)])
def test_parser_is_llama_cpps_on_its_test_cases(template: str, chat_oracle: Path,
                                                oracle_report: OracleReport) -> None:
    source = (reference.llama_cpp_dir() / "models" / "templates" / template).read_text()
    differing, stale = [], []
    cases = BY_TEMPLATE[template]
    for case in cases:
        ours, llama = _ours(case, source), _llama(case, source, chat_oracle)
        listed = (template, case.line) in EXPECTED_DIFFERENCES
        if ours != llama and not listed:
            differing.append(f"{case.name} {case.text!r}: ours {ours!r}, llama.cpp {llama!r}")
        if ours == llama and listed:
            stale.append(case.name)
    oracle_report.add("chat parser: llama.cpp's test-chat cases", template.removesuffix(".jinja"),
                      identical=len(cases) - len(differing) - sum((template, c.line) in EXPECTED_DIFFERENCES
                                                                   for c in cases) + len(stale),
                      total=len(cases))
    assert not differing, "\n".join(differing)
    assert not stale, f"listed as differing, now identical: {stale}"
