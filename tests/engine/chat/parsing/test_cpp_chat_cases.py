"""The project's message parser beside llama.cpp's on llama.cpp's own chat-parser test cases.

The cases are read from the pinned llama.cpp's tests/test-chat.cpp by tests/chat_oracle/cpp_cases.py (its
peg_tester `.test(text)...run()` calls: the template, the text and the request settings; see that module
for the forms it reads and skips). Each text is parsed by both sides, whole, or partial where the case says
`is_partial(true)`: llama.cpp's harness
("parse" mode: common_chat_parse with the parser params llama-server derives) and the project's
`parse_message` on its own chat params (constraintd.chat_templates.chat_grammar_of). Both sides read the clock
(llama.cpp's templates read it, not the request's time). The messages compared:
content, reasoning content, tool calls (name, arguments, id), or both sides refusing. A case that sets the
conversation (`.messages(...)`) and continues its final message goes the same way on both sides: the
harness takes the messages and continue_final_message, the project splits the chat
(constraintd.engine.chat.templates.continuation.continued_chat), renders its prompt, makes its chat params,
and continues the generation prompt (continued_prompt) the parser reads first; the request's prompt and
generation prompt (the harness's "apply" mode) are compared too. llama.cpp's expected values in
test-chat.cpp are not used: the two implementations are compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from constraintd.chat_templates import chat_grammar_of, chat_prompt_of, template_caps
from constraintd.engine.chat.params.chat_params import NotPorted
from constraintd.engine.chat.parsing.message_parser import MessageParseError, parse_message
from constraintd.engine.chat.templates.continuation import (
    continued_chat,
    continued_prompt,
    parse_continuation,
    parser_input,
)
from constraintd.engine.chat.templates.prompt import template_source
from constraintd.engine.chat.templates.template_inputs import parse_messages, parse_tools
from tests import reference
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cpp_cases import CppCase, cases_by_template, cpp_cases, skipped_calls
from tests.chat_oracle.params import llama_params_fields, params_fields
from tests.conftest import OracleReport

pytestmark = pytest.mark.oracle

BY_TEMPLATE = cases_by_template()
# test-chat.cpp's peg_test_case default: one user message
USER_MESSAGE = [{"role": "user", "content": "Hey there!"}]
# a case's continue_final_message, as llama-server's request has it (common_chat_continuation_parse)
CONTINUATION_REQUEST: dict[str, Any] = {"auto": True, "reasoning_content": "reasoning_content",
                                        "content": "content"}

# Where the project's parser does not give llama.cpp's message: (template, test-chat.cpp line) -> why. Every
# other case gives the same message, and a listed case that becomes identical fails the test too.
EXPECTED_DIFFERENCES: dict[tuple[str, int], str] = {}


def _messages(case: CppCase) -> list[dict[str, Any]]:
    # the case's conversation as OpenAI messages (common_chat_msg::to_json_oaicompat), or the default one
    return [message.to_json() for message in case.messages] if case.messages else USER_MESSAGE


def _llama(case: CppCase, source: str, binary: Path) -> dict[str, Any]:
    request: dict[str, Any] = {
        "mode": "parse", "template": source, "bos_token": "", "eos_token": "", "messages": _messages(case),
        "tool_choice": case.tool_choice, "parallel_tool_calls": case.parallel_tool_calls,
        "reasoning_format": case.reasoning_format, "enable_thinking": case.enable_thinking, "text": case.text,
        "add_generation_prompt": case.add_generation_prompt, "is_partial": case.partial,
    }
    if case.continue_final_message in CONTINUATION_REQUEST:
        request["continue_final_message"] = CONTINUATION_REQUEST[case.continue_final_message]
    if case.tools:
        request["tools"] = list(case.tools)
    if case.json_schema is not None:
        request["json_schema"] = case.json_schema
    answer = run_harness(binary, request)
    if "error" in answer:
        return {"error": answer["stage"]}
    message = {"content": answer["content"], "reasoning_content": answer["reasoning_content"],
               "tool_calls": [[c["name"], c["arguments"], c["id"]] for c in answer["tool_calls"]]}
    # the request's chat params (common_chat_templates_apply): grammar, lazy flag, triggers, stops, thinking
    applied = run_harness(binary, request | {"mode": "apply"})
    message |= llama_params_fields(applied)
    if not case.messages:
        return message
    # a case that sets the conversation: its prompt and generation prompt too
    return message | {"prompt": applied["prompt"], "generation_prompt": applied["generation_prompt"]}


def _ours(case: CppCase, source: str) -> dict[str, Any]:
    chat = continued_chat(parse_messages(_messages(case)),
                          parse_continuation(CONTINUATION_REQUEST.get(case.continue_final_message)),
                          add_generation_prompt=case.add_generation_prompt)
    tools = parse_tools(list(case.tools) or None)
    try:
        prompt = chat_prompt_of(source, chat.messages, tools=tools, enable_thinking=case.enable_thinking,
                                add_generation_prompt=chat.add_generation_prompt)
        grammar = chat_grammar_of(
            source, chat.messages, tools=tools, tool_choice=case.tool_choice, json_schema=case.json_schema,
            reasoning_format=case.reasoning_format, enable_thinking=case.enable_thinking,
            parallel_tool_calls=case.parallel_tool_calls, generation_prompt=prompt.generation_prompt,
            continuation=chat.continuation)
        continued = continued_prompt(template_source(source), prompt, chat, grammar)
        generation_prompt, lead = parser_input(prompt, continued)
        message = parse_message(
            lead + case.text, grammar, generation_prompt=generation_prompt,
            tools=[tool.to_json() for tool in tools], tool_choice=case.tool_choice,
            parallel_tool_calls=case.parallel_tool_calls, reasoning_format=case.reasoning_format,
            supports_tool_calls=template_caps(template_source(source)).supports_tool_calls,
            has_response_format=case.json_schema is not None, partial=case.partial)
    except MessageParseError:
        return {"error": "parse"}
    except NotPorted as exc:
        return {"not ported": str(exc)}
    made = {"content": message.content, "reasoning_content": message.reasoning_content,
            "tool_calls": [[c.name, c.arguments, c.id] for c in message.tool_calls], **params_fields(grammar)}
    if not case.messages:
        return made
    return made | {"prompt": continued.prompt, "generation_prompt": continued.generation_prompt}


def test_cases_are_read() -> None:
    # the reader finds the peg_tester cases of every template test-chat.cpp names with a literal path
    assert (len(cpp_cases()), len(BY_TEMPLATE)) == (393, 53)  # as tests/chat_oracle/cpp_cases.py says
    assert skipped_calls() == {"a tester whose template is a variable": 19,
                               "a text that is not string literals": 11,
                               "tools that are not named definitions": 2}
    # the cases that set the conversation, and those of them that continue its final message
    assert sum(bool(case.messages) for case in cpp_cases()) == 72
    assert sum(case.partial for case in cpp_cases()) == 6  # read as a stream's text so far
    assert sum(case.continue_final_message != "none" for case in cpp_cases()) == 69
    # and those whose conversation holds a tool's call (simple_assist_msg with a name and an id) and result
    assert sum(any(message.tool_calls and message.tool_calls[0].id for message in case.messages)
               and any(message.tool_call_id for message in case.messages) for case in cpp_cases()) == 3
    assert {template for template, _ in EXPECTED_DIFFERENCES} <= set(BY_TEMPLATE)


@pytest.mark.parametrize("template", sorted(BY_TEMPLATE), ids=[name.removesuffix(".jinja")
                                                               for name in sorted(BY_TEMPLATE)])
def test_parser_is_llama_cpps_on_its_test_cases(template: str, chat_oracle: Path,
                                                oracle_report: OracleReport) -> None:
    source = (reference.llama_cpp_dir() / "models" / "templates" / template).read_text()
    differing, stale = [], []
    cases = BY_TEMPLATE[template]
    identical: list[CppCase] = []
    for case in cases:
        ours, llama = _ours(case, source), _llama(case, source, chat_oracle)
        listed = (template, case.line) in EXPECTED_DIFFERENCES
        if ours == llama:
            identical.append(case)
        if ours != llama and not listed:
            differing.append(f"{case.name} {case.text!r}: ours {ours!r}, llama.cpp {llama!r}")
        if ours == llama and listed:
            stale.append(case.name)
    subject = template.removesuffix(".jinja")
    oracle_report.add("chat parser: llama.cpp's test-chat cases", subject, identical=len(identical),
                      total=len(cases))
    if any(case.messages for case in cases):  # the cases that set the conversation, a row of their own
        oracle_report.add("chat parser: llama.cpp's test-chat cases with messages", subject,
                          identical=sum(bool(case.messages) for case in identical),
                          total=sum(bool(case.messages) for case in cases))
    assert not differing, "\n".join(differing)
    assert not stale, f"listed as differing, now identical: {stale}"
