# The Gemma 4 format's own map from a parse's AST to a message (common/chat-peg-parser.cpp:
# common_chat_peg_gemma4_mapper and gemma4_to_json): content and reasoning as tagged, and each whole-named
# call with its arguments written as JSON from the gemma4 value rules' nodes (strings between <|"|> marks,
# bare dict keys, no closing bracket or quote where the text ended inside one).
#
# Contract: `gemma4_message(nodes)` takes the parse's top-level AST nodes (peg_parse.ParseResult.nodes) and
# gives (content, reasoning_content, tool calls) as llama.cpp's mapper does: no node under a reasoning,
# content or tool node is visited, reasoning is kept even when it is only whitespace, and a call's id is "".
from __future__ import annotations

import json
from collections.abc import Sequence

from constraintd.engine.chat.parsing.message_scan import ParsedToolCall
from constraintd.engine.chat.parsing.peg_parse import TaggedNode

__all__ = ["find_by_tag", "gemma4_message"]


def _inner(text: str) -> str:
    # escape_json_string_inner: the JSON string's text without its quotes
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _joined(node: TaggedNode, open_: str, close: str) -> str:
    return open_ + ",".join(_to_json(child) for child in node.children) + ("" if node.partial else close)


def _to_json(node: TaggedNode) -> str:
    # gemma4_to_json, by the node's rule
    if not node.text:
        return ""
    rule = node.rule
    if rule in ("gemma4-number", "gemma4-bool", "gemma4-null", "gemma4-dict-key-name"):
        return node.text
    if rule == "gemma4-string-content":
        return _inner(node.text)
    if rule == "gemma4-string":
        if not node.children:
            return '"'
        return '"' + _to_json(node.children[0]) + ("" if node.partial else '"')
    if rule == "gemma4-array":
        return _joined(node, "[", "]")
    if rule == "gemma4-dict":
        return _joined(node, "{", "}")
    if rule == "gemma4-dict-key":
        key = _inner(_to_json(node.children[0])) if node.children else ""
        return '"' + key + ("" if node.partial else '":')
    if rule == "gemma4-dict-kv":
        return "".join(_to_json(child) for child in node.children)
    if rule == "gemma4-value":
        return _to_json(node.children[0]) if node.children else ""
    return ""


def find_by_tag(parent: TaggedNode, tag: str, depth: int = 3) -> TaggedNode | None:
    # common_peg_ast_arena::find_by_tag: the first child with the tag, each child's subtree to `depth`
    for child in parent.children:
        if child.tag == tag:
            return child
        if depth > 1:
            found = find_by_tag(child, tag, depth - 1)
            if found is not None:
                return found
    return None


def gemma4_message(nodes: Sequence[TaggedNode]) -> tuple[str, str, tuple[ParsedToolCall, ...]]:
    """common_chat_peg_gemma4_mapper::from_ast over the parse's top-level nodes (see the contract)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ParsedToolCall] = []

    def visit(node: TaggedNode) -> None:
        if node.tag == "reasoning":
            reasoning.append(node.text)
        elif node.tag == "content":
            content.append(node.text)
        elif node.tag == "tool":
            name, args = find_by_tag(node, "tool-name"), find_by_tag(node, "tool-args")
            if name is not None and args is not None and not name.partial:
                calls.append(ParsedToolCall(name.text, _to_json(args.children[0]) if args.children else ""))
        else:
            for child in node.children:
                visit(child)

    for node in nodes:
        visit(node)
    return "".join(content), "".join(reasoning), tuple(calls)
