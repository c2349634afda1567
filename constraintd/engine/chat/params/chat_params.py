# The grammar side of llama.cpp's chat params (common_chat_params: grammar, grammar_lazy, grammar_triggers,
# preserved_tokens, additional_stops, supports_thinking and the thinking tags), on the templates llama.cpp's
# differential auto-parser handles (common/chat.cpp, chat-auto-parser-generator.cpp, and the PEG arena's
# GBNF in peg-parser.cpp).
#
# Contract:
# - `specialised_format(source)` names the hand-written format llama.cpp picks for a template by marks in its
#   source (common_chat_try_specialized_template, in its order), or None: the auto-parser's templates. A
#   hand-written format's params are its module's (chat/formats/: the request as it came, the arena written
#   here as GBNF); `chat_params` raises NotPorted for a format with no module, and for what a module does not
#   port. A continued final message (continuation.py) changes only ling-3's parser: the rest is built on the
#   generation prompt before the continuation, as llama.cpp builds it. The rest of this contract is the
#   auto-parser's.
# - A request gets a grammar where it has a response schema, or tools llama.cpp sees a syntax for with
#   tool_choice auto (and a word to trigger on) or required. Exact here: no tools, tool_choice none, tools the
#   template has no syntax for, or auto where the format has no word to trigger on, without a schema, give
#   no grammar; a schema (with or without tools, any tool_choice) gives the response-format grammar, never
#   lazy, no triggers; on a template that writes JSON calls, tool_choice auto gives the lazy tool grammar
#   (json_tool_grammar.py) and its word triggers, required the non-lazy one; parallel_tool_calls lets the
#   calls repeat after commas, as standard_json_tools does. On a tag format, with JSON arguments
#   (`<function=name>{...}`, json_tool_grammar.py) or tagged ones (`<arg_key>k</arg_key><arg_value>v
#   </arg_value>`, tagged_tool_grammar.py), tool_choice auto gives the lazy grammar of its calls and the
#   trigger word, required the non-lazy one (the generation prompt, the reasoning, text up to the calls'
#   marker, then the calls). NotPorted there: the parts those modules do not port (argument markers,
#   a tagged format's call ids, ...), and calls with no start marker.
# - The preserved tokens are the analysis's (template_analysis.py), the tag formats' markers included.
# - The response-format grammar is the auto-parser's: the generation prompt up to the reasoning start tag,
#   the optional reasoning block where reasoning is extracted (reasoning_format other than none, and the
#   template has reasoning), then the schema's JSON, bare or in a ```json fence. Its rule names, order and
#   text are llama.cpp's, including the arena number in the reasoning's `until-N` rules.
# - The schema's rules come from the project's converter (constraintd.engine.schema), named as llama.cpp's
#   builder names them (`response-format-schema`, its properties below it).
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from constraintd.engine.aho_corasick import AhoCorasick
from constraintd.engine.chat.analysis.diff_split import C_SPACE, Render, trim_whitespace
from constraintd.engine.chat.analysis.reasoning import ReasoningAnalysis, ReasoningMode
from constraintd.engine.chat.analysis.template_analysis import (
    ContentMode,
    TemplateAnalysis,
    ToolMode,
    analyze_template,
)
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.cohere2moe import cohere2moe_params
from constraintd.engine.chat.formats.deepseek_v3_2 import deepseek_v3_2_params
from constraintd.engine.chat.formats.functionary_v3_2 import functionary_v3_2_params
from constraintd.engine.chat.formats.gemma4 import gemma4_params
from constraintd.engine.chat.formats.gigachat_v3 import gigachat_v3_params
from constraintd.engine.chat.formats.gpt_oss import gpt_oss_params
from constraintd.engine.chat.formats.kimi_k2 import kimi_k2_params
from constraintd.engine.chat.formats.kimi_k3 import kimi_k3_params
from constraintd.engine.chat.formats.lfm2 import lfm2_params
from constraintd.engine.chat.formats.ling3 import ling3_params
from constraintd.engine.chat.formats.minicpm5 import minicpm5_params
from constraintd.engine.chat.formats.minimax_m3 import minimax_m3_params
from constraintd.engine.chat.formats.ministral3 import ministral3_params
from constraintd.engine.chat.formats.muse_glimmer import muse_glimmer_params
from constraintd.engine.chat.formats.qwen3_coder import qwen3_coder_params
from constraintd.engine.chat.params.json_tool_grammar import (
    json_tool_parsers,
    json_tool_rules,
    tag_json_tool_rules,
)
from constraintd.engine.chat.params.tagged_tool_grammar import tagged_tool_rules
from constraintd.engine.chat.peg_arena import PegArena
from constraintd.engine.chat.templates.continuation import Continuation
from constraintd.engine.chat.templates.template_inputs import TemplateCaps
from constraintd.engine.schema.convert import (
    MAX_CONVERSION_SECONDS,
    MAX_GRAMMAR_CHARS,
    MAX_SCHEMA_DEPTH,
    _Converter,
)
from constraintd.engine.schema.json_text import JsonValue, parse_json
from constraintd.engine.schema.nodes import FAILED, WorkLimit, schema_from_json
from constraintd.engine.schema.rules import format_literal, to_bytes
from constraintd.errors import SchemaError

__all__ = [
    "TOOL_CHOICES", "ChatGrammar", "GrammarTrigger", "NotPorted", "chat_params", "format_grammar",
    "regex_escape", "specialised_format",
]

TOOL_CHOICES: Final = ("auto", "required", "none")
"""llama.cpp's tool_choice values (common_chat_tool_choice_parse_oaicompat takes no named function)."""

# (format, marks that must all be in the source, marks that must not be, marks of which one must be), in
# llama.cpp's order of tests
_SPECIALISED: Final[tuple[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...]] = (
    ("ministral-3", ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"), ("[CALL_ID]",), ()),
    ("gpt-oss", ("<|channel|>",), (), ()),
    ("muse-glimmer", ("<atem:function_calls>", "<|eom|>"), (), ()),
    ("functionary-v3.2", (">>>all", ">>>${recipient}"), (), ()),
    ("kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), (), ()),
    ("kimi-k3", ("<|open|>", "<|close|>", "<|end_of_msg|>"), (), ()),
    ("ling-3", ("<role>ASSISTANT</role>", "<arg_key>"), (), ()),
    ("cohere2-moe", ("<|START_TEXT|>", "<|START_ACTION|>"), (), ()),
    ("lfm2", ("<|tool_list_start|>", "<|tool_list_end|>"), (), ()),
    ("lfm2.5", ("List of tools: [",), ("<|tool_list_start|>",), ()),
    ("gigachat-v3", ("<|role_sep|>", "<|message_sep|>"), ("<|function_call|>",), ()),
    ("minimax-m3", ("]<]minimax[>[", "<tool_call>", "<invoke name="), (), ()),
    ("deepseek-v3.2", ("dsml_token", "DSML"), (), ("function_calls", "tool_calls")),
    ("gemma4", ("'<|tool_call>call:'",), (), ()),
    ("minicpm5", ("Tool usage guidelines:", '<function name="', '<param name="'), (), ()),
    ("qwen3-coder", ("<tool_call>", "<function=", "<parameter="),
     ("'<tool_call><function=' ~ tool_call.name ~ '>'",), ()),
)


def specialised_format(source: str) -> str | None:
    """The hand-written format llama.cpp's chat layer uses for this template source, or None where it runs
    its auto-parser (see the module's contract)."""
    for name, present, absent, one_of in _SPECIALISED:
        if all(mark in source for mark in present) and not any(mark in source for mark in absent) \
                and (not one_of or any(mark in source for mark in one_of)):
            return name
    return None


class NotPorted(NotImplementedError):
    """A request whose chat params come from a part of llama.cpp's chat layer not ported yet."""


@dataclass(frozen=True, slots=True)
class GrammarTrigger:
    """A lazy grammar's trigger (common_grammar_trigger): a word, a pattern or a full pattern."""

    kind: str
    value: str

    def pattern(self) -> str:
        """The trigger as llama-server's pattern of it: a word escaped (common.cpp's regex_escape), a
        full pattern anchored at both ends, a pattern as it is."""
        value = self.value
        if self.kind == "word":
            return regex_escape(value)
        if self.kind == "pattern_full":
            if not value:
                return "^$"
            return ("" if value.startswith("^") else "^") + value + ("" if value.endswith("$") else "$")
        return value


def regex_escape(word: str) -> str:
    """A word as a regular expression that matches it (llama.cpp's regex_escape)."""
    return re.sub(r"[.^$|()*+?\[\]{}\\]", lambda m: "\\" + m.group(0), word)


@dataclass(frozen=True, slots=True)
class ChatGrammar:
    """The grammar side of a request's chat params, as llama.cpp's chat layer computes it."""

    grammar: str = ""
    grammar_lazy: bool = False
    grammar_triggers: tuple[GrammarTrigger, ...] = ()
    additional_stops: tuple[str, ...] = ()
    supports_thinking: bool = False
    thinking_start_tag: str = ""
    thinking_end_tags: tuple[str, ...] = ()
    preserved_tokens: tuple[str, ...] | None = None  # None: made without a template's analysis
    analysis: TemplateAnalysis | None = field(default=None, compare=False)
    arena: PegArena | None = field(default=None, compare=False, repr=False)  # a hand-written format's parser
    format_name: str = ""  # a hand-written format's name (specialised_format's), its parser's mapper


# The rules llama.cpp's PEG builder writes for p.json() (peg-parser.cpp json_value and its parts), as its
# GBNF writer prints them: fixed texts, the same for every request.
_JSON_RULES: Final = {
    "json-value": "json-object | json-array | json-string | json-number | json-bool | json-null",
    "json-object": '"{" space ("}" | json-string space ":" space json-value '
                   '(space "," space json-string space ":" space json-value)* space "}")',
    "json-array": '"[" space ("]" | json-value (space "," space json-value)* space "]")',
    "json-string": '"\\"" ( [^"\\\\] | "\\\\" ( ["\\\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\\""',
    "json-number": '"-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? (("e" | "E") [+-]? [0-9]+)?',
    "json-bool": '"true" | "false"',
    "json-null": '"null"',
}


def _literal(text: str) -> str:
    # the converter keeps its texts as bytes (one character per byte): a literal goes in the same way
    return format_literal(to_bytes(text))


def _escape_class_char(cpt: int) -> str:
    # gbnf_escape_char_class
    if chr(cpt) in "-][\\":
        return "\\" + chr(cpt)
    named = {0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r"}
    if cpt in named:
        return named[cpt]
    if 0x20 <= cpt <= 0x7E:
        return chr(cpt)
    if cpt <= 0xFF:
        return f"\\x{cpt:02X}"
    if cpt <= 0xFFFF:
        return f"\\u{cpt:04X}"
    return f"\\U{cpt:08X}"


def _char_class(cpts: Sequence[int], *, negate: bool) -> str:
    return ("[^" if negate else "[") + "".join(map(_escape_class_char, cpts)) + "]"


def _state_grammar(add_rule: Any, prefix: str, strings: Sequence[str], *, including: bool) -> str:
    """gbnf_ac_grammar: one rule per state of the strings' automaton that matches none of them; with
    `including`, gbnf_including_grammar (the text up to and including the first of the strings: a character
    that completes one ends the rule), else gbnf_excluding_grammar (the text that contains none of them:
    every state may end, a completing character has no way on)."""
    automaton = AhoCorasick([list(map(ord, word)) for word in strings])

    def state_name(state: int) -> str:
        return prefix if state == 0 else f"{prefix}-{state:02d}"

    for state in range(len(automaton.children)):
        if automaton.terminal(state):
            continue
        buckets: dict[int, list[int]] = {}
        completing: list[int] = []
        specific: list[int] = []
        for cpt in automaton.alphabet:
            target = automaton.next(state, cpt)
            if automaton.terminal(target):
                completing.append(cpt)
                specific.append(cpt)
            elif target != 0:
                buckets.setdefault(target, []).append(cpt)
                specific.append(cpt)
        alternatives = [] if including else [""]
        if including and completing:
            alternatives.append(_char_class(completing, negate=False))
        alternatives += [f"{_char_class(buckets[target], negate=False)} {state_name(target)}"
                         for target in sorted(buckets)]
        alternatives.append(f"{_char_class(specific, negate=True)} {state_name(0)}")
        add_rule(state_name(state), " | ".join(alternatives).lstrip(" "))
    if automaton.terminal(0):
        add_rule(prefix, "|")
    return state_name(0)


def _excluding_grammar(add_rule: Any, prefix: str, strings: Sequence[str]) -> str:
    """gbnf_excluding_grammar: the strings that contain none of `strings`, one rule per automaton state."""
    return _state_grammar(add_rule, prefix, strings, including=False)


def _optspace(tag: str) -> tuple[list[str], int]:
    """common_chat_peg_builder::optspace: the tag's core as a literal, each whitespace character around it
    optional; with the number of parsers the builder adds for it (what numbers the rules after it)."""
    lead = len(tag) - len(tag.lstrip(C_SPACE))
    # all whitespace: each character optional, then an empty literal
    core_end = len(tag) if lead == len(tag) else len(tag.rstrip(C_SPACE))
    parts = [_literal(c) + "?" for c in tag[:lead]]
    parts.append(_literal(tag[lead:core_end]))
    parts.extend(_literal(c) + "?" for c in tag[core_end:])
    optional_chars = lead + (len(tag) - core_end)
    return parts, 1 + 3 * optional_chars + 2  # eps; literal + repeat + sequence each; literal + sequence


def _reasoning_block(add_rule: Any, reasoning: ReasoningAnalysis) -> str:
    """analyze_reasoning::build_parser's GBNF: optional(optspace(start) reasoning(until(end)) optspace(end)).

    The `until` parser's rule is named by its arena number: the parser context's epsilon is number 0, and
    the compiler llama.cpp is built with evaluates the right operand of `+` first, so optspace(end)'s
    parsers come before it."""
    if reasoning.mode not in (ReasoningMode.TAG_BASED, ReasoningMode.TOOLS_ONLY) or not reasoning.end:
        return ""
    end_parts, end_count = _optspace(reasoning.end)
    until_id = 1 + end_count
    until = _excluding_grammar(add_rule, f"until-{until_id}", [trim_whitespace(reasoning.end)])
    parts = _optspace(reasoning.start)[0] if reasoning.start else []
    return "(" + " ".join([*parts, until, *end_parts]) + ")?"


class _GrammarText:
    """The grammar being built: the schema converter's rules (llama.cpp's common_grammar_builder adds the PEG
    arena's rules and each schema's to one converter), printed sorted by name."""

    def __init__(self) -> None:
        self.limit = WorkLimit(max_depth=MAX_SCHEMA_DEPTH, deadline=time.monotonic() + MAX_CONVERSION_SECONDS)
        self.converter = _Converter(schema_from_json({}, self.limit), self.limit, MAX_GRAMMAR_CHARS)

    def add_rule(self, name: str, rule: str) -> str:
        return self.converter.add_rule(name, rule)

    def add_schema(self, name: str, schema: Any) -> str:
        # each schema resolves its own $refs (a schema parser holds its own document)
        document = schema_from_json(parse_json(json.dumps(schema, ensure_ascii=False)), self.limit)
        self.converter.document = document
        return self.converter.visit(document.root, name)

    def text(self) -> str:
        errors = self.converter.errors
        if errors:
            raise SchemaError(FAILED + "\n".join(text for text, _ in errors), pointer=errors[0][1])
        return self.converter.format_grammar().encode("latin-1").decode("utf-8")


def _response_format_grammar(schema: JsonValue, generation_prompt: str, reasoning: ReasoningAnalysis,
                             *, extract_reasoning: bool) -> str:
    built = _GrammarText()
    start = trim_whitespace(reasoning.start)
    prompt = generation_prompt if not start or start not in generation_prompt else \
        generation_prompt[:generation_prompt.find(start)]
    block = _reasoning_block(built.add_rule, reasoning) if extract_reasoning else ""
    built.add_rule("response-format", built.add_schema("response-format-schema", schema))
    for name, rule in _JSON_RULES.items():
        built.add_rule(name, rule)
    body = [_literal(prompt)] if prompt else []
    body += ["space"] + ([block] if block else []) + ["space"]
    body.append('("```json" space response-format space "```" | space response-format space)')
    built.add_rule("root", " ".join(body))
    return built.text()


def _reasoning_parsers(reasoning: ReasoningAnalysis, *, extract: bool) -> int:
    # how many parsers analyze_reasoning::build_parser adds to the arena (see _reasoning_block)
    if not extract or reasoning.mode is ReasoningMode.NONE or not reasoning.end:
        return 1  # eps()
    end = _optspace(reasoning.end)[1]
    if reasoning.start:
        return end + 2 + _optspace(reasoning.start)[1] + 3  # until, tag; the two sequences, the optional
    return end + 2 + 2


def _json_tool_grammar(tools: Sequence[Mapping[str, Any]], analysis: TemplateAnalysis, *, force: bool,
                       generation_prompt: str = "", extract_reasoning: bool = False,
                       parallel_tool_calls: bool = False) -> str:
    """The lazy grammar (trigger rules only), or with `force` the non-lazy one: the generation prompt, the
    reasoning, text up to the call (or the wrapped content), then the calls."""
    built = _GrammarText()
    reasoning = analysis.reasoning
    start = trim_whitespace(reasoning.start)
    prompt = generation_prompt if not start or start not in generation_prompt else \
        generation_prompt[:generation_prompt.find(start)]
    block = _reasoning_block(built.add_rule, reasoning) if force and extract_reasoning else ""
    try:
        triggers = json_tool_rules(tools, analysis.tools, add_rule=built.add_rule,
                                   add_schema=built.add_schema, literal=_literal, force=force,
                                   parallel_tool_calls=parallel_tool_calls)
        # the arena before the last expression: the context's eps(), the reasoning, the parser's eps(), tools
        arena = 1 + _reasoning_parsers(reasoning, extract=extract_reasoning) + 1 + json_tool_parsers(
            len(tools), analysis.tools, force=force, parallel_tool_calls=parallel_tool_calls)
    except NotImplementedError as exc:
        raise NotPorted(str(exc)) from None
    for name, rule in _JSON_RULES.items():
        built.add_rule(name, rule)
    if not force:
        built.add_rule("root", " | ".join(sorted(triggers)))
        return built.text()
    wrapped = analysis.content_mode is ContentMode.ALWAYS_WRAPPED
    if wrapped and analysis.content_start and analysis.content_end:
        # optional(start content(until(end)) end), built before the last expression: its until comes first
        until = _excluding_grammar(built.add_rule, f"until-{arena}", [analysis.content_end])
        content = f"({_literal(analysis.content_start)} {until} {_literal(analysis.content_end)})?"
    else:
        # the last expression makes end() before until(tool start)
        tools_format = analysis.tools
        tool_start = tools_format.section_start or tools_format.per_call_start or "{"
        content = _excluding_grammar(built.add_rule, f"until-{arena + 1}", [tool_start]) + "?"
    body = [_literal(prompt)] if prompt else []
    body += ["space"] + ([block] if block else []) + [content, triggers[-1]]
    built.add_rule("root", " ".join(body))
    return built.text()


def _tag_tool_grammar(tools: Sequence[Mapping[str, Any]], analysis: TemplateAnalysis, *, force: bool,
                      generation_prompt: str = "", extract_reasoning: bool = False,
                      parallel_tool_calls: bool = False) -> str:
    """The grammar of a tag format's calls (JSON or tagged arguments): the lazy one (trigger rules only), or
    with `force` the non-lazy one: the generation prompt, the reasoning, text up to the first call's marker,
    then the calls (build_tool_parser_tag_json and build_tool_parser_tag_tagged end the same way)."""
    built = _GrammarText()
    reasoning = analysis.reasoning
    block = _reasoning_block(built.add_rule, reasoning) if force and extract_reasoning else ""
    # the arena before the tools parser: the context's eps(), the reasoning, the parser's eps()
    first = 1 + _reasoning_parsers(reasoning, extract=extract_reasoning) + 1

    def until(prefix: str, end: str) -> str:
        return _state_grammar(built.add_rule, prefix, [end], including=False)

    def ac(prefix: str, end: str) -> str:
        return _state_grammar(built.add_rule, prefix, [end], including=True)

    try:
        if analysis.tools.mode is ToolMode.TAG_WITH_JSON:
            rules = tag_json_tool_rules(tools, analysis.tools, add_rule=built.add_rule,
                                        add_schema=built.add_schema, literal=_literal, until=until,
                                        first_parser=first, parallel_tool_calls=parallel_tool_calls,
                                        force=force)
        else:
            rules = tagged_tool_rules(
                tools, analysis.tools, add_rule=built.add_rule, add_schema=built.add_schema, literal=_literal,
                until=until, ac=ac, first_parser=first, parallel_tool_calls=parallel_tool_calls, force=force)
    except NotImplementedError as exc:
        raise NotPorted(str(exc)) from None
    for name, rule in _JSON_RULES.items() if rules.json_values else ():
        built.add_rule(name, rule)
    if not force:
        built.add_rule("root", " | ".join(sorted(rules.triggers)))
        return built.text()
    start = trim_whitespace(reasoning.start)
    prompt = generation_prompt if not start or start not in generation_prompt else \
        generation_prompt[:generation_prompt.find(start)]
    # optional(content(until(the trigger marker))), made right after the calls
    content = _excluding_grammar(built.add_rule, f"until-{rules.next_parser}", [analysis.trigger_marker])
    body = [_literal(prompt)] if prompt else []
    body += ["space"] + ([block] if block else []) + [content + "?", rules.triggers[-1]]
    built.add_rule("root", " ".join(body))
    return built.text()


# a hand-written format's init, by the name specialised_format gives (each takes the request's tools,
# tool_choice, parallel_tool_calls, json_schema and reasoning_format; those that read more say so below)
_FORMATS: Final[Mapping[str, Callable[..., FormatParams]]] = {
    "cohere2-moe": cohere2moe_params, "deepseek-v3.2": deepseek_v3_2_params,
    "functionary-v3.2": functionary_v3_2_params, "gemma4": gemma4_params, "gigachat-v3": gigachat_v3_params,
    "gpt-oss": gpt_oss_params, "kimi-k2": kimi_k2_params, "kimi-k3": kimi_k3_params, "ling-3": ling3_params,
    "lfm2": partial(lfm2_params, tool_list_tokens=True),
    "lfm2.5": partial(lfm2_params, tool_list_tokens=False), "minicpm5": minicpm5_params,
    "minimax-m3": minimax_m3_params, "ministral-3": ministral3_params, "muse-glimmer": muse_glimmer_params,
    "qwen3-coder": qwen3_coder_params,
}
_READS_THINKING: Final = frozenset({"deepseek-v3.2", "minimax-m3"})  # enable_thinking
_READS_GENERATION_PROMPT: Final = frozenset({"ling-3"})  # whether the prompt leaves a thought open
_READS_CONTINUATION: Final = frozenset({"ling-3"})  # whether a continued message's thought is open


def _format_params(name: str, source: str, *, tools: Sequence[Mapping[str, Any]], tool_choice: str,
                   parallel_tool_calls: bool, json_schema: JsonValue, reasoning_format: str,
                   enable_thinking: bool, generation_prompt: str, continuation: Continuation) -> FormatParams:
    # common_chat_try_specialized_template's call of the format's init, with the request as it came
    init = _FORMATS.get(name)
    if init is None:
        raise NotPorted(f"the {name} format's chat params")
    options: dict[str, Any] = {
        "tools": tools, "tool_choice": tool_choice, "json_schema": json_schema,
        "parallel_tool_calls": parallel_tool_calls, "reasoning_format": reasoning_format,
    }
    if name in _READS_THINKING:
        options["enable_thinking"] = enable_thinking
    if name in _READS_GENERATION_PROMPT:
        options["generation_prompt"] = generation_prompt
    if name in _READS_CONTINUATION:
        options["continuation"] = continuation
    return init(source, **options)


def format_grammar(made: FormatParams, format_name: str = "") -> ChatGrammar:
    """A hand-written format's params (chat/formats/) as chat params: its arena written as GBNF where the
    request gets a grammar (and kept, the message parser's, with `format_name` naming its mapper), its trigger
    words then patterns, stops, thinking tags and preserved tokens as they are."""
    grammar = ""
    if made.arena is not None and made.writes_grammar:
        built = _GrammarText()

        def ac_grammar(prefix: str, strings: Sequence[str], including: bool) -> str:
            return _state_grammar(built.add_rule, prefix, strings, including=including)

        made.arena.build_grammar(built.add_rule, built.add_schema, ac_grammar, lazy=made.grammar_lazy)
        grammar = built.text()
    triggers = [GrammarTrigger("word", word) for word in made.trigger_words]
    triggers += [GrammarTrigger("pattern", pattern) for pattern in made.trigger_patterns]
    return ChatGrammar(
        grammar, made.grammar_lazy, tuple(triggers),
        additional_stops=made.additional_stops, supports_thinking=made.supports_thinking,
        thinking_start_tag=made.thinking_start_tag, thinking_end_tags=made.thinking_end_tags,
        preserved_tokens=made.preserved_tokens, arena=made.arena, format_name=format_name)


def chat_params(
    source: str,
    render: Render,
    caps: TemplateCaps,
    *,
    generation_prompt: str,
    tools: Sequence[Mapping[str, Any]] = (),
    tool_choice: str = "auto",
    parallel_tool_calls: bool = False,
    json_schema: JsonValue = None,
    reasoning_format: str = "auto",
    enable_thinking: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    analyze: Callable[[], TemplateAnalysis] | None = None,
    continuation: Continuation = Continuation.NONE,
) -> ChatGrammar:
    """The grammar side of llama.cpp's chat params for a request (see the module's contract).

    `source` is the template llama.cpp renders (prompt.template_source), `render(context)` renders it in
    llama.cpp's Jinja dialect, `generation_prompt` is the request's (prompt.chat_prompt's). `analyze`
    gives the template's analysis where the caller remembers it (the same as `analyze_template` of these
    arguments makes; by default that is called). `enable_thinking` is the request's (only a hand-written
    format reads it: the auto-parser's templates read it through their generation prompt). `continuation`
    is what of a final message the request continues (continuation.continued_chat's; `generation_prompt` then
    the one rendered before it is continued, as llama.cpp builds its parser on).

    Raises:
        NotPorted: the template has a hand-written format not ported, or the request's grammar holds tool
            calls of a form not ported (a tag format's argument markers, JSON calls nested under a function
            object, ...).
        SchemaError: llama.cpp refuses the response schema.
        ValueError: a tool_choice llama.cpp does not take.
    """
    if tool_choice not in TOOL_CHOICES:
        raise ValueError(f"Invalid tool_choice: {tool_choice}")
    specialised = specialised_format(source)
    if specialised is not None:
        try:
            made = _format_params(specialised, source, tools=tools, tool_choice=tool_choice,
                                  parallel_tool_calls=parallel_tool_calls, json_schema=json_schema,
                                  reasoning_format=reasoning_format, enable_thinking=enable_thinking,
                                  generation_prompt=generation_prompt, continuation=continuation)
        except NotImplementedError as exc:
            raise NotPorted(str(exc)) from None
        return format_grammar(made, specialised)
    analysis = (analyze() if analyze is not None
                else analyze_template(source, render, caps, bos_token=bos_token, eos_token=eos_token))
    reasoning = analysis.reasoning
    supports_thinking = reasoning.mode is not ReasoningMode.NONE
    end_tag = trim_whitespace(reasoning.end)
    preserved = analysis.preserved_tokens
    common: dict[str, Any] = {
        "additional_stops": tuple(analysis.additional_stops), "supports_thinking": supports_thinking,
        "thinking_start_tag": trim_whitespace(reasoning.start) if supports_thinking else "",
        "thinking_end_tags": (end_tag,) if supports_thinking and end_tag else (),
        "preserved_tokens": tuple(preserved), "analysis": analysis,
    }
    if isinstance(json_schema, dict) and json_schema:
        grammar = _response_format_grammar(json_schema, generation_prompt, reasoning,
                                           extract_reasoning=reasoning_format != "none")
        return ChatGrammar(grammar, **common)
    has_tools = bool(tools) and analysis.tools.mode is not ToolMode.NONE
    if not has_tools or tool_choice == "none" or (tool_choice == "auto" and analysis.trigger_marker == ""):
        return ChatGrammar(**common)  # no grammar: no tool syntax, no tools wanted, or nothing to trigger on
    extract_reasoning = reasoning_format != "none"
    if analysis.tools.mode in (ToolMode.TAG_WITH_JSON, ToolMode.TAG_WITH_TAGGED):
        if analysis.trigger_marker == "":
            # llama.cpp writes an optional of nothing there, a "?" alone in its root
            raise NotPorted("the tag formats' calls with no start marker (tool_choice required)")
        force = tool_choice == "required"
        grammar = _tag_tool_grammar(tools, analysis, force=force, generation_prompt=generation_prompt,
                                    extract_reasoning=extract_reasoning,
                                    parallel_tool_calls=parallel_tool_calls)
        if force:
            return ChatGrammar(grammar, **common)
        return ChatGrammar(grammar, True, (GrammarTrigger("word", analysis.trigger_marker),), **common)
    if tool_choice == "required":
        grammar = _json_tool_grammar(tools, analysis, force=True, generation_prompt=generation_prompt,
                                     extract_reasoning=extract_reasoning,
                                     parallel_tool_calls=parallel_tool_calls)
        return ChatGrammar(grammar, **common)
    triggers = [GrammarTrigger("word", analysis.trigger_marker)]
    if analysis.tools.openai_wrapper_trigger:
        triggers.append(GrammarTrigger("word", '{"type": "function",'))
    lazy = _json_tool_grammar(tools, analysis, force=False, parallel_tool_calls=parallel_tool_calls)
    return ChatGrammar(lazy, True, tuple(triggers), **common)
