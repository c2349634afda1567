"""The project's chat params (constraintd.engine.chat.params.chat_params) beside llama.cpp's, on the requests
of tests/chat_oracle/cases.py's PARAMS_CASES.

Compared, byte for byte: the grammar, the lazy flag, the triggers, the additional stops, supports_thinking and
the thinking tags; and the preserved tokens apart. A case the project does not compute yet (`NotPorted`: a
hand-written format, or a tag format's call ids) is counted apart, never as identical.

`compare_analysis` compares the auto-parser's analysis of a template (harness "analyze" mode) with the
project's (constraintd.engine.chat.analysis.template_analysis), field by field: reasoning, content, the
tool-call format's mode, markers and JSON fields, the function, argument and call id markers, the preserved
tokens and
the additional stops (not the user and assistant start markers, which the project does not compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from constraintd.engine.chat.analysis.template_analysis import TemplateAnalysis, analyze_template
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.chat_params import ChatGrammar, NotPorted, format_grammar
from constraintd.engine.chat.templates.prompt import template_source
from constraintd.engine.chat.templates.template_inputs import parse_messages, parse_tools
from sampler_worker.prompt import chat_grammar_of, render_template, template_caps
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import (
    BOS_TOKEN,
    EOS_TOKEN,
    MESSAGE_SETS,
    PARAMS_CASES,
    RESPONSE_SCHEMA,
    ParamsCase,
)

FIELDS = ("grammar", "grammar_lazy", "grammar_triggers", "additional_stops", "supports_thinking",
          "thinking_start_tag", "thinking_end_tags")


def params_fields(grammar: ChatGrammar) -> dict[str, Any]:
    """The project's chat params as the fields compared (FIELDS)."""
    return {
        "grammar": grammar.grammar, "grammar_lazy": grammar.grammar_lazy,
        "grammar_triggers": [[t.kind, t.value] for t in grammar.grammar_triggers],
        "additional_stops": list(grammar.additional_stops),
        "supports_thinking": grammar.supports_thinking, "thinking_start_tag": grammar.thinking_start_tag,
        "thinking_end_tags": list(grammar.thinking_end_tags),
    }


def llama_params_fields(answer: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's chat params (the harness's "apply" answer) as the fields compared (FIELDS)."""
    fields = {name: answer[name] for name in FIELDS}
    fields["grammar_triggers"] = [[t["type"], t["value"]] for t in answer["grammar_triggers"]]
    return fields


def format_fields(made: FormatParams) -> dict[str, Any]:
    """A hand-written format's params (constraintd.engine.chat.formats) as the fields compared here, as
    chat_params gives them to a request (format_grammar)."""
    return params_fields(format_grammar(made))


def format_differences(made: FormatParams, llama: dict[str, Any]) -> list[str]:
    """The fields of a hand-written format's params that are not llama.cpp's (its harness answer): those
    compared here, the preserved tokens and the message delimiters."""
    ours = {**format_fields(made), "preserved_tokens": list(made.preserved_tokens),
            "message_delimiters": [[role, text] for role, text in made.message_delimiters]}
    delimiters = [[each["role"], each["delimiter"]] for each in llama["message_delimiters"]]
    theirs = {**llama_params_fields(llama), "preserved_tokens": llama["preserved_tokens"],
              "message_delimiters": delimiters}
    return [name for name in ours if ours[name] != theirs[name]]


@dataclass(frozen=True, slots=True)
class ParamsComparison:
    """One case on one template: both sides' fields, or why the project's side is not computed."""

    template: str
    case: str
    ours: dict[str, Any] | None
    llama: dict[str, Any]
    not_ported: str | None = None
    preserved_tokens: tuple[str, ...] | None = None  # the project's, where it knows them

    @property
    def same_preserved_tokens(self) -> bool:
        return self.preserved_tokens is not None and "error" not in self.llama and \
            list(self.preserved_tokens) == self.llama["preserved_tokens"]

    @property
    def identical(self) -> bool:
        return (self.ours is not None and "error" not in self.llama
                and self.ours == llama_params_fields(self.llama))

    def describe(self) -> str:
        if self.not_ported is not None:
            return f"{self.case}: not ported ({self.not_ported})"
        if "error" in self.llama:
            return f"{self.case}: llama.cpp refused: {self.llama['error']}"
        assert self.ours is not None
        llama = llama_params_fields(self.llama)
        return f"{self.case}: " + "; ".join(
            f"{name}: ours {self.ours[name]!r} llama.cpp {llama[name]!r}"
            for name in FIELDS if self.ours[name] != llama[name])


_CASES_OWN: Final = object()  # the case's response schema: RESPONSE_SCHEMA where it has one, else none


def project_params(source: str, case: ParamsCase, *, now: int, parallel_tool_calls: bool = False,
                   tools: list[dict[str, Any]] | None = None, json_schema: Any = _CASES_OWN) -> ChatGrammar:
    """The project's chat params for this case (with `tools`, `json_schema` in place of the case's).

    Raises:
        NotPorted: the case needs a part of llama.cpp's chat layer not ported yet.
    """
    return chat_grammar_of(
        source, parse_messages(MESSAGE_SETS["system+user"]),
        tools=parse_tools(case.tool_list if tools is None else tools), tool_choice=case.llama_tool_choice,
        json_schema=(RESPONSE_SCHEMA if case.schema else None) if json_schema is _CASES_OWN else json_schema,
        reasoning_format=case.reasoning_format, bos_text=BOS_TOKEN, eos_text=EOS_TOKEN,
        enable_thinking=case.thinking, now=now, parallel_tool_calls=parallel_tool_calls)


def compare_case(
    binary: Path, path: Path, case: ParamsCase, *, now: int, parallel_tool_calls: bool = False,
    tools: list[dict[str, Any]] | None = None, json_schema: Any = _CASES_OWN,
) -> ParamsComparison:
    """One case on one template file, both sides at the same time `now` (Unix seconds); `tools` and
    `json_schema` (None: no schema) in place of the case's where given."""
    source = path.read_text()
    extra: dict[str, Any] = {"parallel_tool_calls": parallel_tool_calls}
    if tools is not None:
        extra["tools"] = tools
    request = case.request(source, now=now, **extra)
    if json_schema is not _CASES_OWN:
        request.pop("json_schema", None)
        if json_schema is not None:
            request["json_schema"] = json_schema
    llama = run_harness(binary, request)
    try:
        made = project_params(source, case, now=now, parallel_tool_calls=parallel_tool_calls, tools=tools,
                              json_schema=json_schema)
    except NotPorted as exc:
        return ParamsComparison(path.stem, case.name, None, llama, str(exc))
    return ParamsComparison(path.stem, case.name, params_fields(made), llama, None, made.preserved_tokens)


# tool_choice auto and required with parallel_tool_calls on (PARAMS_CASES leave it off, as llama-server does)
PARALLEL_CASES = (ParamsCase("auto", True, False), ParamsCase("required", True, False))


def compare_params(binary: Path, path: Path, *, now: int, parallel_tool_calls: bool = False
                   ) -> list[ParamsComparison]:
    """Every case of PARAMS_CASES (with `parallel_tool_calls`: PARALLEL_CASES, parallel calls on) on one
    template file, both sides at the same time `now` (Unix seconds)."""
    return [compare_case(binary, path, case, now=now, parallel_tool_calls=parallel_tool_calls)
            for case in (PARALLEL_CASES if parallel_tool_calls else PARAMS_CASES)]


def _llama_analysis(answer: dict[str, Any]) -> dict[str, Any]:
    tools = answer["tools"]
    return {
        "reasoning": [answer["reasoning"][k] for k in ("mode", "start", "end")],
        "content": [answer["content"][k] for k in ("mode", "start", "end")],
        "tool mode": tools["format"]["mode"], "additional stops": answer["additional_stops"],
        "tool format": [tools["format"][k] for k in TOOL_FORMAT_FIELDS],
        "function": [tools["function"][k] for k in FUNCTION_FIELDS],
        "arguments": [tools["arguments"][k] for k in ARGUMENTS_FIELDS],
        "call id": [tools["call_id"][k] for k in CALL_ID_FIELDS],
        "preserved tokens": answer["preserved_tokens"],
    }


TOOL_FORMAT_FIELDS = ("section_start", "section_end", "per_call_start", "per_call_end", "fun_name_is_key",
                      "tools_array_wrapped", "openai_wrapper_trigger", "function_field", "name_field",
                      "args_field", "id_field", "gen_id_field", "parameter_order")
# llama.cpp's names in its tool_function_analysis, tool_arguments_analysis and tool_id_analysis; the project's
# ToolFormat names each one after its struct where the bare name would be ambiguous
FUNCTION_FIELDS = {"name_prefix": "name_prefix", "name_suffix": "name_suffix",
                   "args_separator": "args_separator", "close": "function_close"}
ARGUMENTS_FIELDS = {"start": "args_start", "end": "args_end", "name_prefix": "arg_name_prefix",
                    "name_suffix": "arg_name_suffix", "value_prefix": "arg_value_prefix",
                    "value_suffix": "arg_value_suffix", "separator": "arg_separator",
                    "tolerate_intertag_whitespace": "tolerate_intertag_whitespace"}
CALL_ID_FIELDS = {"pos": "call_id_position", "prefix": "call_id_prefix", "suffix": "call_id_suffix"}


def _our_analysis(ours: TemplateAnalysis) -> dict[str, Any]:
    tools = ours.tools
    return {
        "reasoning": [ours.reasoning.mode.name, ours.reasoning.start, ours.reasoning.end],
        "content": [ours.content_mode.name, ours.content_start, ours.content_end],
        "tool mode": tools.mode.name, "additional stops": ours.additional_stops,
        "tool format": [getattr(tools, k) for k in TOOL_FORMAT_FIELDS],
        "function": [getattr(tools, k) for k in FUNCTION_FIELDS.values()],
        "arguments": [getattr(tools, k) for k in ARGUMENTS_FIELDS.values()],
        "call id": [tools.call_id_position.name, tools.call_id_prefix, tools.call_id_suffix],
        "preserved tokens": ours.preserved_tokens,
    }


def compare_analysis(binary: Path, path: Path, *, now: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The auto-parser's analysis of one template file: (the project's fields, llama.cpp's same fields)."""
    return compare_source_analysis(binary, template_source(path.read_text()), now=now)


def compare_source_analysis(binary: Path, source: str, *, now: float
                            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The auto-parser's analysis of a template's source, as `compare_analysis`."""
    answer = run_harness(binary, {"mode": "analyze", "template": source, "bos_token": BOS_TOKEN,
                                  "eos_token": EOS_TOKEN})
    ours = analyze_template(source, lambda context: render_template(source, context, now=now),
                            template_caps(source, now=now), bos_token=BOS_TOKEN, eos_token=EOS_TOKEN)
    return _our_analysis(ours), _llama_analysis(answer)
