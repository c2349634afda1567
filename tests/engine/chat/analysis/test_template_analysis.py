"""constraintd.engine.chat.analysis.template_analysis on small hand-written tag formats, beside llama.cpp's
analysis.

The reference's templates (test_chat_params.py compares the analysis on each) write a call's id in one place
only, between the function's name and its arguments; these templates put it before the name, after the
arguments and inside a marker, and end an argument's value with whitespace alone, so that each rule of
extract_call_id_markers and extract_argument_value_markers is compared with llama.cpp's on a case it decides.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chat_oracle.params import compare_source_analysis
from tests.conftest import OracleReport

# one user turn, one assistant turn with its calls (CALLS written once per call) or its content
FRAME = (
    "{%- for m in messages -%}{%- if m.role == 'user' -%}<|user|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}<|assistant|>"
    "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}CALLS{%- endfor -%}"
    "{%- else -%}{{ m.content }}{%- endif -%}<|end|>{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
TAGGED_ARGUMENTS = "{%- for k, v in tc.function.arguments.items() -%}"
# name -> (one call, what llama.cpp's analysis finds in it that the case is here for)
CALLS = {
    "id-before-name": (
        "<call><id>{{ tc.id }}</id><name>{{ tc.function.name }}</name>" + TAGGED_ARGUMENTS
        + "<arg>{{ k }}</arg><val>{{ v }}</val>{%- endfor -%}</call>",
        {"call id": ["PRE_FUNC_NAME", "<id>", "</id>"]}),
    "id-inside-a-marker": (
        "<call id={{ tc.id }}><name>{{ tc.function.name }}</name>{{ tc.function.arguments | tojson }}</call>",
        {"call id": ["PRE_FUNC_NAME", "<|assistant|>", "<name>"]}),
    "id-after-arguments": (
        "<tool>{{ tc.function.name }}{{ tc.function.arguments | tojson }}<id>{{ tc.id }}</id></tool>",
        {"call id": ["POST_ARGS", "<id>", "</id>"]}),
    "id-after-the-call": (  # the call's end found first, </id>, cleared: it is the id's suffix
        "<tool>{{ tc.function.name }}{{ tc.function.arguments | tojson }}</tool><id>{{ tc.id }}</id>",
        {"call id": ["POST_ARGS", "<id>", "</id>"]}),
    "id-between-name-and-arguments": (
        "[TOOL]{{ tc.function.name }}[ID]{{ tc.id }}[/ID]{{ tc.function.arguments | tojson }}[/TOOL]",
        {"call id": ["BETWEEN_FUNC_AND_ARGS", "[ID]", "[/ID]"]}),
    "value-ends-in-whitespace": (  # a value's suffix of whitespace alone is no suffix
        "<tool_call>{{ tc.function.name }}" + TAGGED_ARGUMENTS + "<p={{ k }}>{{ v }}{{ '\\n' }}{%- endfor -%}"
        "</tool_call>",
        {"arguments": ["", "", "<p=", ">", "", "", "", False]}),
    "no-end-marker": (  # the function's close read beside an answer without calls
        "<fn={{ tc.function.name }}>" + TAGGED_ARGUMENTS + "<p={{ k }}>{{ v }}{{ '\\n' }}{%- endfor -%}</fn>",
        {"arguments": ["", "", "<p=", ">", "", "\n</fn><|end|>", "", False]}),
}


@pytest.mark.oracle
@pytest.mark.parametrize("name", CALLS)
def test_tag_format_analysis_is_llama_cpps(name: str, chat_oracle: Path, oracle_report: OracleReport) -> None:
    calls, found = CALLS[name]
    ours, llama = compare_source_analysis(chat_oracle, FRAME.replace("CALLS", calls), now=time.time())
    oracle_report.add("chat auto-parser analysis, hand-written tag formats", name,
                      identical=int(ours == llama), total=1)
    assert {field: llama[field] for field in found} == found  # the case still decides its rule
    assert ours == llama
