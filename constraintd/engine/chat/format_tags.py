# Which of a hand-written format's tag parsers is which of llama.cpp's tags (common_chat_peg_builder's
# reasoning, content, tool_open, tool_name, tool_args, tool_arg_name, ... in chat-peg-parser.h): the PEG
# arena (chat/peg_arena.py) keeps a tag's place and child but not its name, so a format's tags are named here
# from the parser each tag wraps, as the format's builder calls wrap them (chat/formats/).
#
# Contract:
# - `format_of(preserved_tokens)` names the hand-written format whose chat params preserve these tokens (each
#   format's first preserved token is its own), or None.
# - `tag_names(format, arena)` maps every tag parser the format's mapper reads to its tag; a tag left out
#   (tool, tool-arg) is one common_chat_peg_mapper ignores.
# - Only the formats in PARSED are named: the others' parse is not ported (they end with end(), read
#   strings of another delimiter, or have a mapper of their own), and tag_names refuses them.
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import gemma4, kimi_k2, kimi_k3, lfm2
from constraintd.engine.chat.formats.deepseek_v3_2 import DSML
from constraintd.engine.chat.json_tool_grammar import rule_name, tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["PARSED", "format_of", "tag_names"]

# each format's first preserved token (chat/formats/*: the preserved_tokens its *_params gives)
_FIRST_PRESERVED: Final = {
    "<tool_call>": "qwen3-coder", "<|channel>": "gemma4", "[THINK]": "ministral-3",
    "<|tool_calls_section_begin|>": "kimi-k2", "<|open|>": "kimi-k3", "｜DSML｜": "deepseek-v3.2",
    "<|tool_call_start|>": "lfm2", "<|START_OF_TURN_TOKEN|>": "cohere2-moe",
    "<|message_sep|>\n\n": "gigachat-v3", "]<]minimax[>[": "minimax-m3", "<think>": "ling-3",
    ">>>all": "functionary-v3.2", "<|start|>": "muse-glimmer", "<|channel|>": "gpt-oss",
    "<function": "minicpm5",
}


def format_of(preserved_tokens: tuple[str, ...] | None) -> str | None:
    """The hand-written format whose chat params preserve these tokens, or None."""
    return _FIRST_PRESERVED.get(preserved_tokens[0]) if preserved_tokens else None


def _parents(arena: PegArena) -> dict[int, list[int]]:
    parents: dict[int, list[int]] = {}
    for parser in range(len(arena)):
        for child in arena.children(parser):
            parents.setdefault(child, []).append(parser)
    return parents


def _opener(arena: PegArena, parser: int) -> str:
    # the text of a sequence's first child where it is a literal ("<function=", "<parameter=")
    children = arena.children(parser)
    if arena.kind(parser) != "sequence" or not children or arena.kind(children[0]) != "literal":
        return ""
    return arena.text(children[0])


# qwen3-coder (common/parsers/qwen3-coder.cpp)
_QWEN_ARG_CLOSE: Final = "\n</parameter>\n"
_QWEN_OPENERS: Final = {
    "<function=": ("tool-open", "tool-name"), "<parameter=": ("tool-arg-open", "tool-arg-name"),
}


def _qwen3_coder(arena: PegArena) -> dict[int, str]:
    root = arena.children(arena.root)
    if arena.kind(arena.root) != "sequence" or arena.text(root[0]) != "<|im_start|>assistant\n":
        raise NotImplementedError("the parser of a qwen3-coder arena of another shape")
    parents = _parents(arena)
    names: dict[int, str] = {}
    for parser in range(len(arena)):
        if arena.kind(parser) != "tag":
            continue
        (child,) = arena.children(parser)
        kind = arena.kind(child)
        if kind == "until":
            delimiters = arena.delimiters(child)
            names[parser] = ("reasoning" if delimiters == ("</think>", "<tool_call>") else
                             "tool-arg-string-value" if delimiters == (_QWEN_ARG_CLOSE,) else "content")
        elif kind == "schema":  # the response's JSON, or an argument's
            names[parser] = "content" if arena.text(child) == "response-format" else "tool-arg-value"
        elif kind == "choice":  # the JSON alternatives of an argument that may also be a string
            names[parser] = "tool-arg-value"
        elif kind == "literal" and arena.text(child) in (_QWEN_ARG_CLOSE, "</function>\n"):
            names[parser] = "tool-arg-close" if arena.text(child) == _QWEN_ARG_CLOSE else "tool-close"
        elif kind == "literal":  # a name: "<function=" + tool_name(...) or "<parameter=" + tool_arg_name(...)
            (atomic,) = parents[parser]
            opener = _opener(arena, parents[atomic][0])
            names[parser] = _QWEN_OPENERS[opener][1]
        elif kind == "sequence" and _opener(arena, child) in _QWEN_OPENERS:
            names[parser] = _QWEN_OPENERS[_opener(arena, child)][0]
    for parser in range(len(arena)):
        # tool(tool_open(...) + tool_args(args) + tool_close(...)): the tag after the open is the arguments
        children = arena.children(parser)
        if arena.kind(parser) != "sequence" or len(children) != 3 or arena.kind(children[0]) != "atomic":
            continue
        if names.get(arena.children(children[0])[0]) == "tool-open" and arena.kind(children[1]) == "tag":
            names[children[1]] = "tool-args"
    return names


def _ministral3(arena: PegArena) -> dict[int, str]:
    # common/parsers/ministral3.cpp: [THINK]reasoning[/THINK], content, then calls written
    # `[TOOL_CALLS]name[ARGS]{...}` (tool_open(tool_name(name) + "[ARGS]") + tool_args(schema(json())))
    if arena.kind(arena.root) != "sequence" or arena.kind(arena.children(arena.root)[0]) != "eps":
        raise NotImplementedError("the parser of a ministral-3 arena of another shape")
    names: dict[int, str] = {}
    for parser in range(len(arena)):
        if arena.kind(parser) != "tag":
            continue
        (child,) = arena.children(parser)
        kind = arena.kind(child)
        if kind == "until":
            names[parser] = "reasoning" if arena.delimiters(child) == ("[/THINK]",) else "content"
        elif kind == "schema":
            names[parser] = "content" if arena.text(child) == "response-format" else "tool-args"
        elif kind == "sequence":
            first, *rest = arena.children(child)
            if rest == [] or arena.kind(rest[-1]) != "literal" or arena.text(rest[-1]) != "[ARGS]":
                continue
            names[parser] = "tool-open"
            names[arena.children(first)[0]] = "tool-name"  # atomic(tag(literal(name)))
    return names


def _kimi_k2(arena: PegArena) -> dict[int, str]:
    # common/parsers/kimi-k2.cpp: <think>reasoning</think>, content, then calls written
    # `<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>`
    if arena.kind(arena.root) != "sequence" or arena.kind(arena.children(arena.root)[0]) != "literal":
        raise NotImplementedError("the parser of a kimi-k2 arena of another shape")
    names: dict[int, str] = {}
    for parser in range(len(arena)):
        if arena.kind(parser) != "tag":
            continue
        (child,) = arena.children(parser)
        kind, parts = arena.kind(child), arena.children(child)
        if kind == "until":
            names[parser] = "reasoning" if arena.delimiters(child)[0] == kimi_k2.THINK_END else "content"
        elif kind == "schema":
            names[parser] = "tool-args"
        elif kind == "repeat":  # optional(literal(CALL_END))
            names[parser] = "tool-close"
        elif kind == "sequence" and arena.kind(parts[-1]) == "literal" \
                and arena.text(parts[-1]) == kimi_k2.ARGS_BEGIN:
            names[parser] = "tool-open"
        elif kind == "sequence" and _opener(arena, child) == "functions.":
            names[parser] = "tool-id"
            names[arena.children(parts[1])[0]] = "tool-name"  # atomic(tag(literal(name)))
    return names


def _deepseek_v3_2(arena: PegArena) -> dict[int, str]:
    # common/parsers/deepseek.cpp: <think>reasoning</think>, content, then a block of DSML invokes, each
    # `<｜DSML｜invoke name="f">` with `<｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>`
    invoke, param = "<" + DSML + 'invoke name="', "<" + DSML + 'parameter name="'
    openers = {invoke: ("tool-open", "tool-name"), param: ("tool-arg-open", "tool-arg-name")}
    closes = {"</" + DSML + "parameter>": "tool-arg-close", "</" + DSML + "invoke>": "tool-close"}
    if arena.kind(arena.root) != "sequence":
        raise NotImplementedError("the parser of a deepseek-v3.2 arena of another shape")
    parents = _parents(arena)
    names: dict[int, str] = {}
    for parser in range(len(arena)):
        if arena.kind(parser) != "tag":
            continue
        (child,) = arena.children(parser)
        kind = arena.kind(child)
        if kind == "until":
            delimiters = arena.delimiters(child)
            names[parser] = ("tool-arg-string-value" if delimiters == ("</" + DSML + "parameter>",) else
                             "reasoning" if "</think>" in delimiters else "content")
        elif kind == "schema":
            names[parser] = "content" if arena.text(child) == "response-format-schema" else "tool-arg-value"
        elif kind == "literal" and arena.text(child) in closes:
            names[parser] = closes[arena.text(child)]
        elif kind == "literal":  # a name: an open's literal + tool_name(...) or tool_arg_name(...)
            (atomic,) = parents[parser]
            names[parser] = openers[_opener(arena, parents[atomic][0])][1]
        elif kind == "sequence" and _opener(arena, child) in openers:
            names[parser] = openers[_opener(arena, child)][0]
    return names


def _kimi_k3(arena: PegArena, tools: Sequence[Mapping[str, Any]], reasoning_format: str) -> dict[int, str]:
    # common/parsers/kimi-k3.cpp: a think section (reasoning, or content where reasoning_format is none), a
    # response section, then `<|open|>call tool="f" ...<|sep|>` calls with `<|open|>argument key="k"
    # ...<|sep|>value<|close|>argument<|sep|>` arguments, a value a string where the tool's schema says so
    if arena.kind(arena.root) != "sequence" or arena.kind(0) != "end":
        raise NotImplementedError("the parser of a kimi-k3 arena of another shape")
    parents = _parents(arena)
    names: dict[int, str] = {}
    for parser in range(len(arena)):
        if arena.kind(parser) != "tag":
            continue
        (child,) = arena.children(parser)
        kind = arena.kind(child)
        if kind == "until" and arena.delimiters(child) == (kimi_k3.THINK_END, kimi_k3.RESP_START):
            names[parser] = "content" if reasoning_format == "none" else "reasoning"
        elif kind == "until" and arena.delimiters(child) != (kimi_k3.ARG_END,):
            names[parser] = "content"
        elif kind == "literal" and arena.text(child) in _KIMI_K3_MARKERS:
            names[parser] = _KIMI_K3_MARKERS[arena.text(child)]
        elif kind == "literal":  # a tool's name after CALL_START, or an argument's key after ARG_START's tag
            (atomic,) = parents[parser]
            first = arena.children(parents[atomic][0])[0]
            names[parser] = "tool-name" if arena.kind(first) == "literal" else "tool-arg-name"
        elif kind == "sequence" and _opener(arena, child) == kimi_k3.CALL_START:
            names[parser] = "tool-open"
    for parser in range(len(arena)):
        children = arena.children(parser)
        if arena.kind(parser) == "sequence" and len(children) == 3 and arena.kind(children[0]) == "atomic" \
                and names.get(arena.children(children[0])[0]) == "tool-open":
            names[children[1]] = "tool-args"
    for name, function in tool_functions(tools):
        properties = tool_parameters(function).get("properties") or {}
        for key, schema in properties.items():
            declared = schema.get("type") if isinstance(schema, Mapping) else None
            string = not isinstance(declared, str) or declared == "string"
            (argument,) = arena.children(arena.rule_parser(rule_name(f"kimi-k3-arg-{name}-{key}")))
            # tool_arg(open + name + '"' + until(SEP) + SEP + value + close): the one tag not under an atomic
            parts = arena.children(arena.children(argument)[0])
            (value,) = [part for part in parts if arena.kind(part) == "tag"]
            names[value] = "tool-arg-string-value" if string else "tool-arg-value"
    return names


def _gemma4(arena: PegArena) -> dict[int, str]:
    # common/parsers/gemma4.cpp: thought channels (their body reasoning, or the whole block content), content,
    # then calls `<|tool_call>call:name{...}<tool_call|>`: tool(tool_open(tool_name(name) + peek("{")) +
    # tool_args(ref("gemma4-dict")))
    root = arena.children(arena.root)
    if arena.kind(arena.root) != "sequence" or arena.kind(root[0]) != "ref" or arena.text(root[0]) != "start":
        raise NotImplementedError("the parser of a gemma4 arena of another shape")
    names: dict[int, str] = {}
    for parser in range(len(arena)):
        if arena.kind(parser) != "tag":
            continue
        (child,) = arena.children(parser)
        kind, parts = arena.kind(child), arena.children(child)
        if kind == "until":
            names[parser] = "reasoning" if arena.delimiters(child) == (gemma4.THINKING_END,) else "content"
        elif kind == "schema" or (kind == "sequence" and _opener(arena, child) == gemma4.THINKING_START):
            names[parser] = "content"
        elif kind == "sequence" and len(parts) == 2 and arena.kind(parts[1]) == "and":
            names[parser] = "tool-open"
            names[arena.children(parts[0])[0]] = "tool-name"  # atomic(tag(literal(name)))
        elif kind == "sequence" and len(parts) == 2 and arena.kind(parts[1]) == "tag":
            names[parser] = "tool"
            names[parts[1]] = "tool-args"
    return names


def _lfm2(arena: PegArena) -> dict[int, str]:
    # common/parsers/lfm2.cpp with python_style_tool_calls: <think>reasoning</think>, content, then
    # `<|tool_call_start|>[name(key="value", other=3)]<|tool_call_end|>`: tool_open(tool_name(name) + "("),
    # each argument tool_arg_open(tool_arg_name(key) + "=") + tool_arg_value(...) + tool_arg_close(eps())
    root = arena.children(arena.root)
    if arena.kind(arena.root) != "sequence" or arena.text(root[0]) != lfm2.GENERATION_PROMPT:
        raise NotImplementedError("the parser of a lfm2 arena of another shape")
    parents = _parents(arena)
    names: dict[int, str] = {}
    for parser in range(len(arena)):
        if arena.kind(parser) != "tag":
            continue
        (child,) = arena.children(parser)
        kind, parts = arena.kind(child), arena.children(child)
        if kind == "until":
            names[parser] = "reasoning" if arena.delimiters(child) == (lfm2.THINK_END,) else "content"
        elif kind == "schema":
            names[parser] = "content"
        elif kind in ("choice", "ref"):  # a quoted string, or python_or_json_value()
            names[parser] = "tool-arg-value"
        elif kind == "eps":
            names[parser] = "tool-arg-close"
        elif kind == "literal" and arena.kind(parents[parser][0]) == "atomic" \
                and _closer(arena, parents[parents[parser][0]][0]) in _LFM2_OPENERS:
            names[parser] = _LFM2_OPENERS[_closer(arena, parents[parents[parser][0]][0])][1]
        elif kind == "literal" and arena.text(child) == ")":
            names[parser] = "tool-close"
        elif kind == "sequence" and _closer(arena, child) in _LFM2_OPENERS and len(parts) == 2:
            names[parser] = _LFM2_OPENERS[_closer(arena, child)][0]
    for parser in range(len(arena)):
        # tool(tool_open(...) + space() + tool_args(args) + space() + tool_close(...))
        children = arena.children(parser)
        if arena.kind(parser) == "sequence" and len(children) == 5 and arena.kind(children[0]) == "atomic" \
                and names.get(arena.children(children[0])[0]) == "tool-open":
            names[children[2]] = "tool-args"
    return names


_LFM2_OPENERS: Final = {"(": ("tool-open", "tool-name"), "=": ("tool-arg-open", "tool-arg-name")}


def _closer(arena: PegArena, parser: int) -> str:
    # the text of a sequence's last child where it is a literal ("(", "=")
    children = arena.children(parser)
    if arena.kind(parser) != "sequence" or not children or arena.kind(children[-1]) != "literal":
        return ""
    return arena.text(children[-1])


_KIMI_K3_MARKERS: Final = {
    kimi_k3.CALL_END: "tool-close", kimi_k3.ARG_END: "tool-arg-close", kimi_k3.ARG_START: "tool-arg-open",
}

Namer = Callable[[PegArena, Sequence[Mapping[str, Any]], str], dict[int, str]]
PARSED: Final[dict[str, Namer]] = {
    "qwen3-coder": lambda arena, tools, reasoning: _qwen3_coder(arena),
    "ministral-3": lambda arena, tools, reasoning: _ministral3(arena),
    "kimi-k2": lambda arena, tools, reasoning: _kimi_k2(arena),
    "deepseek-v3.2": lambda arena, tools, reasoning: _deepseek_v3_2(arena),
    "kimi-k3": _kimi_k3, "gemma4": lambda arena, tools, reasoning: _gemma4(arena),
    "lfm2": lambda arena, tools, reasoning: _lfm2(arena),
}


def _named_by_arena(format_name: str) -> Namer:
    # a format whose arena names its tags itself (PegArena.tag's name): parsed only where every tag is named
    def names(arena: PegArena, tools: Sequence[Mapping[str, Any]], reasoning_format: str) -> dict[int, str]:
        if any(arena.kind(parser) == "tag" and not arena.text(parser) for parser in range(len(arena))):
            raise NotImplementedError(f"the parser of the {format_name} format")
        return {}
    return names


# the formats with llama.cpp's standard mapper whose arenas name their tags
for _name in ("cohere2-moe", "gigachat-v3", "gpt-oss", "functionary-v3.2", "ling-3", "minicpm5",
              "muse-glimmer"):
    PARSED[_name] = _named_by_arena(_name)


def tag_names(format_name: str, arena: PegArena, *, tools: Sequence[Mapping[str, Any]] = (),
              reasoning_format: str = "auto") -> dict[int, str]:
    """The tag of each tag parser of `arena`, a request's parser of the format `format_name` (built for
    these tools and reasoning_format, which decide some tags where the arena alone does not).

    Raises:
        NotImplementedError: the format's parse is not ported.
    """
    if format_name not in PARSED:
        raise NotImplementedError(f"the parser of the {format_name} format")
    return PARSED[format_name](arena, tools, reasoning_format)
