"""Chat requests in the service core (constraintd/service/chat.py, the CHAT constraint): one compiled grammar
per distinct grammar and triggers, the request's time fixed in its key, refusals."""

from __future__ import annotations

import json
import time

import pytest

from constraintd.engine.chat.parsing.chat_format import ChatFormat
from constraintd.errors import ChatTemplateError, FreeTextError, InputError, NotPortedError
from constraintd.service.chat import ChatRequest, ChatSettings, resolve_chat
from constraintd.service.constraints import Constraint, ConstraintKind, resolve
from constraintd.service.limits import Limits
from constraintd.service.operations import Operations, SessionPlan
from constraintd.service.registry import Registry
from constraintd.service.sessions import SessionStore
from constraintd.v1 import constraintd_pb2 as pb
from tests import reference
from tests.chat_oracle.cases import template_paths

TEMPLATES = {path.stem: path.read_text() for path in template_paths()}
QWEN = TEMPLATES["Qwen-Qwen2.5-7B-Instruct"]


def tool(name: str, argument: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "description": f"{name}.", "parameters": {
        "type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]}}}


WEATHER, TIME, DATE = tool("get_weather", "city"), tool("get_time", "zone"), tool("get_date", "zone")


def operations() -> Operations:
    limits = Limits()
    return Operations(Registry(limits), SessionStore(limits), limits)


def chat(content: str, tools: list[dict[str, object]], tool_choice: str = "auto", *,
         now: float = 1_767_000_000.0) -> pb.ChatRequest:
    return pb.ChatRequest(template=QWEN, messages=json.dumps([{"role": "user", "content": content}]),
                          tools=json.dumps(tools), tool_choice=tool_choice, now=now)


def test_the_same_tool_set_compiles_once_whatever_the_messages() -> None:
    ops = operations()
    vocab = ops.register_vocab(pb.RegisterVocabRequest(gguf_path=str(reference.vocab_path("qwen2")))).vocab_id
    registry = ops.registry

    def open_session(request: pb.ChatRequest) -> pb.CreateSessionResponse:
        return ops.create_session(pb.CreateSessionRequest(vocab_id=vocab, chat=request))

    first = open_session(chat("Weather in Paris?", [WEATHER, TIME]))
    assert registry.grammar_count == 1
    # other messages, the same tools: other prompts, the same compiled grammar
    second = open_session(chat("And in Rome, at noon?", [WEATHER, TIME]))
    assert second.chat.prompt != first.chat.prompt
    assert second.chat.grammar == first.chat.grammar
    assert registry.grammar_count == 1
    # the same request again, another time: the same grammar (Qwen's template prints no date)
    open_session(chat("Weather in Paris?", [WEATHER, TIME], now=1_800_000_000.0))
    assert registry.grammar_count == 1
    # another tool set, and the same tools forced: a grammar each
    open_session(chat("Weather in Paris?", [WEATHER, DATE]))
    assert registry.grammar_count == 2
    open_session(chat("Weather in Paris?", [WEATHER, TIME], "required"))
    assert registry.grammar_count == 3
    open_session(chat("Weather in Rome?", [WEATHER, TIME], "required"))  # the same generation prompt
    assert registry.grammar_count == 3


def plan_on_a_small_vocabulary(ops: Operations, request: pb.CreateSessionRequest) -> SessionPlan:
    # plan_session looks the vocabulary up: register a small one and point the request at it
    vocab = ops.register_vocab(pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=[b"a", b"b"])))
    request.vocab_id = vocab.vocab_id
    return ops.plan_session(request)


def test_a_request_without_a_time_gets_the_servers_clock_in_its_key() -> None:
    ops = operations()
    before = time.time()
    plan = plan_on_a_small_vocabulary(ops, pb.CreateSessionRequest(chat=chat("Hi", [WEATHER], now=0.0)))
    assert before <= json.loads(plan.constraint.text)["now"] <= time.time()
    given = plan_on_a_small_vocabulary(ops, pb.CreateSessionRequest(chat=chat("Hi", [WEATHER], now=5.0)))
    assert json.loads(given.constraint.text)["now"] == 5.0


def test_a_chat_constraint_resolves_as_resolve_chat() -> None:
    request = ChatRequest(template=QWEN, messages=json.dumps([{"role": "user", "content": "Hi"}]),
                          tools=json.dumps([WEATHER]), now=1.0)
    resolved = resolve(Constraint(ConstraintKind.CHAT, request.to_text()))
    grammar, settings = resolve_chat(request)
    assert (resolved.gbnf, resolved.chat) == (grammar, settings)
    assert resolved.trigger_words == ("<tool_call>\n",) and settings.grammar_lazy
    assert ChatRequest.from_text(request.to_text()) == request


def test_triggers_given_beside_a_chat_request_are_refused() -> None:
    ops = operations()
    request = pb.CreateSessionRequest(chat=chat("Hi", [WEATHER]),
                                      options=pb.SessionOptions(trigger_patterns=["x"]))
    with pytest.raises(InputError, match="a chat request brings its own triggers"):
        plan_on_a_small_vocabulary(ops, request)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"messages": "[{"}, "the chat request's messages are not JSON"),
        ({"tools": "{}"}, "Expected 'tools' to be an array"),
        ({"reasoning_format": "deepseek"}, "reasoning_format 'deepseek' is none of"),
        ({"template": "{% if %}"}, "the chat template does not render"),
    ],
    ids=["messages", "tools", "reasoning-format", "template"],
)
def test_a_bad_chat_request_is_an_input_error(changes: dict[str, str], words: str) -> None:
    fields = {"template": QWEN, "messages": json.dumps([{"role": "user", "content": "Hi"}]),
              "tools": json.dumps([WEATHER]), "now": 1.0, **changes}
    with pytest.raises(InputError, match=words):
        resolve(Constraint(ConstraintKind.CHAT, ChatRequest(**fields).to_text()))


def test_a_refused_chat_request_is_remembered_not_resolved_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # a real service core, counting the resolutions the refused request costs
    from constraintd.service import constraints

    resolved: list[ChatRequest] = []

    def counting(request: ChatRequest) -> tuple[str, ChatSettings]:
        resolved.append(request)
        return resolve_chat(request)

    monkeypatch.setattr(constraints, "resolve_chat", counting)
    ops = operations()
    vocab = ops.register_vocab(pb.RegisterVocabRequest(gguf_path=str(reference.vocab_path("qwen2")))).vocab_id
    refused = pb.CreateSessionRequest(vocab_id=vocab, chat=chat("Weather in Paris?", [WEATHER], "get_news"))
    raised = []
    for _ in range(3):
        with pytest.raises(InputError, match="tool_choice 'get_news' names none of the tools") as caught:
            ops.create_session(refused)
        raised.append(caught.value)
    assert len(resolved) == 1
    assert ops.registry.refused_count == 1
    first, *again = raised
    for error in again:
        assert error is not first and (type(error), error.args) == (type(first), first.args)
    # the same tools with a choice that names one: resolved, and not taken for the refused request
    ops.create_session(pb.CreateSessionRequest(vocab_id=vocab, chat=chat("Weather in Paris?", [WEATHER],
                                                                         "get_weather")))
    assert len(resolved) == 2 and ops.registry.grammar_count == 1


def test_a_lazy_tool_grammar_on_a_thinking_template_is_held_with_its_tags() -> None:
    # the caller keeps the thinking block from the grammar, as llama-server's reasoning budget does
    grammar, settings = resolve_chat(ChatRequest(
        template=TEMPLATES["Qwen-Qwen3-0.6B"], messages=json.dumps([{"role": "user", "content": "Hi"}]),
        tools=json.dumps([WEATHER]), now=1.0))
    assert grammar and settings.grammar_lazy and settings.trigger_words == ("<tool_call>\n",)
    assert (settings.thinking_start_tag, settings.thinking_end_tags) == ("<think>", ("</think>",))


def test_a_hand_written_formats_request_carries_its_parser() -> None:
    # qwen3-coder: no analysis, its PEG arena instead; the settings read back parse the format's calls
    grammar, settings = resolve_chat(ChatRequest(
        template=TEMPLATES["Qwen3-Coder"], messages=json.dumps([{"role": "user", "content": "Hi"}]),
        tools=json.dumps([WEATHER]), now=1.0))
    assert grammar and settings.grammar_lazy
    parser = ChatFormat.from_json(settings.parser)
    assert parser.analysis is None and parser.arena is not None
    call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
            "</tool_call>")
    message = parser.parse("Let me look.\n" + call)
    assert message.content == "Let me look.\n"
    called = [(c.name, json.loads(c.arguments)) for c in message.tool_calls]
    assert called == [("get_weather", {"city": "Paris"})]


def test_free_text_and_not_ported_are_refused_as_their_own_classes() -> None:
    # the worker acts on each by its class (free text generated unconstrained; what is not ported said so)
    with pytest.raises(FreeTextError, match="asks for free text"):
        resolve(Constraint(ConstraintKind.CHAT, ChatRequest(
            template=QWEN, messages=json.dumps([{"role": "user", "content": "Hi"}]),
            tools=json.dumps([WEATHER]), tool_choice="none", now=1.0).to_text()))
    # Mistral Small 3.2's template without its call ids and [ARGS] markers: function names with nothing
    # after them but the arguments (atomic function names), not ported
    no_call_ids = TEMPLATES["Mistral-Small-3.2-24B-Instruct-2506"].replace(
        "{{- '[CALL_ID]' + tool_call.id }}", "").replace("'[ARGS]' + tool_call", "tool_call")
    with pytest.raises(NotPortedError, match=r"^not ported yet: the tag formats' atomic function names"):
        resolve(Constraint(ConstraintKind.CHAT, ChatRequest(
            template=no_call_ids,
            messages=json.dumps([{"role": "user", "content": "Hi"}]), tools=json.dumps([WEATHER]),
            tool_choice="required", now=1.0).to_text()))
    with pytest.raises(ChatTemplateError):
        resolve(Constraint(ConstraintKind.CHAT, ChatRequest(
            template="{{ raise_exception('no such chat') }}",
            messages=json.dumps([{"role": "user", "content": "Hi"}]), now=1.0).to_text()))
