# The MiniMax-M3 format's own map from a parse's AST to a message (common/chat-peg-parser.cpp:
# common_chat_peg_minimax_m3_mapper and its minimax_m3_* helpers): content and reasoning as tagged, and each
# named call with its arguments written as JSON from its tagged members (tool-arg), whose values are strings
# (tool-arg-string-value, escaped and quoted), objects and arrays (tool-arg-object, tool-arg-array of
# tool-arg-item elements) or verbatim JSON (tool-arg-value); no closing bracket or quote where the text
# ended inside one.
#
# Contract: `minimax_m3_message(nodes)` takes the parse's top-level AST nodes (peg_parse.ParseResult.nodes)
# and gives (content, reasoning_content, tool calls) as llama.cpp's mapper does: no node under a reasoning,
# content or tool node is visited, reasoning is kept even when it is only whitespace, and a call's id is "".
from __future__ import annotations

import json
from collections.abc import Sequence

from constraintd.engine.chat.parsing.gemma4_message import find_by_tag
from constraintd.engine.chat.parsing.message_scan import ParsedToolCall
from constraintd.engine.chat.parsing.peg_parse import TaggedNode

__all__ = ["minimax_m3_message"]

_VALUE_TAGS = ("tool-arg-value", "tool-arg-string-value", "tool-arg-object", "tool-arg-array")


def _collect(node: TaggedNode, tag: str) -> list[TaggedNode]:
    # minimax_m3_collect: the nodes with the tag under `node`, not looking inside them
    found: list[TaggedNode] = []
    for child in node.children:
        if child.tag == tag:
            found.append(child)
        else:
            found.extend(_collect(child, tag))
    return found


def _value_of(node: TaggedNode) -> TaggedNode | None:
    return next((child for child in node.children if child.tag in _VALUE_TAGS), None)


def _member(node: TaggedNode) -> str:
    name = find_by_tag(node, "tool-arg-name")
    if name is None:
        return ""
    return json.dumps(name.text, ensure_ascii=False) + ":" + _value(_value_of(node), closed=not node.partial)


def _container(node: TaggedNode, *, is_object: bool, closed: bool) -> str:
    entries = _collect(node, "tool-arg" if is_object else "tool-arg-item")
    texts = [_member(entry) if is_object else _value(_value_of(entry), closed=not entry.partial)
             for entry in entries]
    body = ",".join(text for text in texts if text)
    return ("{" if is_object else "[") + body + (("}" if is_object else "]") if closed else "")


def _value(node: TaggedNode | None, *, closed: bool) -> str:
    if node is None:
        return ""
    if node.tag in ("tool-arg-object", "tool-arg-array"):
        return _container(node, is_object=node.tag == "tool-arg-object", closed=closed)
    if node.tag == "tool-arg-string-value":
        return '"' + json.dumps(node.text, ensure_ascii=False)[1:-1] + ('"' if closed else "")
    return node.text  # numbers and booleans as the model wrote them


def minimax_m3_message(nodes: Sequence[TaggedNode]) -> tuple[str, str, tuple[ParsedToolCall, ...]]:
    """common_chat_peg_minimax_m3_mapper::from_ast over the parse's top-level nodes (see the contract)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ParsedToolCall] = []

    def visit(node: TaggedNode) -> None:
        if node.tag == "reasoning":
            reasoning.append(node.text)
        elif node.tag == "content":
            content.append(node.text)
        elif node.tag == "tool":
            name = find_by_tag(node, "tool-name")
            if name is not None:
                arguments = _container(node, is_object=True, closed=not node.partial)
                calls.append(ParsedToolCall(name.text, arguments))
        else:
            for child in node.children:
                visit(child)

    for node in nodes:
        visit(node)
    return "".join(content), "".join(reasoning), tuple(calls)
