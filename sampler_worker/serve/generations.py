# Generations for the HTTP server: a bounded queue in front of n slots (the model's context, or the
# sequences of one batched context), each request on a worker thread, its tokens handed to the event loop
# as they come.
#
# Contract:
# - `Generations.start(job, deadline=)` waits for a free context and starts the job on a worker thread;
#   it never queues more than `max_queue` requests behind the busy contexts: one more is refused at once
#   with `QueueFull` (the server answers 429 with Retry-After), never kept in an unbounded backlog. A
#   request still waiting at its deadline gets `DeadlinePassed`.
# - A `Run` gives the loop its events in order: `Started` (the prompt is tokenized and the constraintd
#   session open: every error of the request itself comes before it), then one `Token` per step, then
#   `Finished`, or `Failed` at any point. Nothing blocks the loop: the model and the constraintd calls
#   run on the worker thread.
# - `Run.cancel()` (a client gone) and the deadline end the generation at its next token, or before the
#   next chunk of its prompt (n_batch tokens; one slot or several): the worker
#   raises out of `generate`, which leaves the session's `with` block, so the constraintd session is
#   closed then and there; the context goes back to the pool only once the worker thread has ended,
#   so no two threads ever use one context.
# - With one slot, the generation loop is `sampler_worker.generate.generate`, the one `sampler-worker
#   generate` runs, on the same prompt tokens and settings: a seeded request's tokens are the command's.
#   With n > 1 slots, the worker thread hands its generation to the batched context's `Lockstep`, which
#   steps every running generation with one decode and one constraintd `Step` message, and waits for it
#   (`sampler_worker.serve.lockstep`); the worker thread still opens and closes the constraintd session.
# - A chat with tools (`job.tools`) is prepared on the worker thread as `sampler-worker generate --tools`
#   prepares it (sampler_worker.prompt.tool_chat): the session made by the service from the chat request
#   (the grammar, its triggers or its prefill), the reply's prompt tokenized, the template's stops added,
#   the preserved tokens written into the text. `Started` carries that `ToolChat`, whose parser reads the
#   answer; a request the service refuses (a template, a tool_choice, what is not ported) fails the run
#   before `Started`, and so does a format whose parser is not ported (NotPorted). A chat with a response
#   schema (`job.chat_schema`) is prepared the same way, without tools, and its `ToolChat` travels the same
#   way: its parser reads the thinking block apart from the answer, whose content is the content rule's.
# - The chat template is the model's, or the server's `--chat-template` (`Generations(template=)`).
# - An OpenAI chat on a thinking template runs llama-server's reasoning budget (`reasoning_budget` of its
#   chat settings: the session's for a chat with tools or a schema, the engine's own for any other): the
#   request's budget and message, else the server's (`Generations(reasoning_budget=,
#   reasoning_budget_message=)`), with one slot or several. A run whose request set `reasoning_control` can
#   be told to end its block (`Generations.control`, from any thread): the flag is read by the thread that
#   samples, before the next decode, which forces the end tag.
# - Metrics are written on the loop only (a done callback), from a tally the worker thread filled; the
#   gauge of open constraintd sessions moves when a session opens and when it closes (the worker thread
#   schedules the change on the loop, before it ends: at `wait_idle()` the gauge counts no ended run).
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from clients import ChatSettings, Session
from constraintd.engine.chat.templates.template_inputs import ChatMessage as TemplateMessage
from sampler_worker.generate import Counters, Generation, Overlap, Step, generate
from sampler_worker.model import Model
from sampler_worker.prompt import ToolChat, chat_settings, chat_text, reasoning_budget, tool_chat
from sampler_worker.reasoning_budget import ReasoningBudget
from sampler_worker.serve.bodies import Job, RequestError
from sampler_worker.serve.contexts import Slot
from sampler_worker.serve.lockstep import Lockstep, Mode
from sampler_worker.serve.metrics import Metrics

__all__ = [
    "ContextLengthError",
    "DeadlinePassed",
    "Failed",
    "Finished",
    "Generations",
    "QueueFull",
    "Run",
    "Started",
    "Token",
]

Mask = npt.NDArray[np.int32]


def _batched_overlap(overlap: Overlap) -> Mode:
    """A batched context's overlap for the server's `--overlap`: "auto" is "ahead" there.

    The generation loop's auto probes both modes per generation; a batched step's decode (of every lane) is
    long against a `Step` round trip, so mask-ahead hides the round trip without a probe.
    """
    return "off" if overlap == "off" else "ahead"


class QueueFull(Exception):
    """Every context is busy and the queue behind them is full.

    Attributes:
        retry_after: seconds after which a retry may find room (the `Retry-After` header).
    """

    def __init__(self, retry_after: int) -> None:
        super().__init__("the server is busy: every generation slot is in use and the queue is full")
        self.retry_after = retry_after


class DeadlinePassed(Exception):
    """The request's deadline passed before its generation ended."""


class ContextLengthError(RequestError):
    """The prompt leaves no room in the context."""


class _Stopped(Exception):
    # raised inside `generate` (from its step callback) to end it: a client gone or a deadline passed
    pass


@dataclass(frozen=True, slots=True)
class Started:
    """The prompt is evaluated next and the constraint is in place.

    Attributes:
        prompt_tokens: the prompt's length in tokens.
        chat: a chat with tools or a response schema as it was prepared (its parser reads the answer), or
            None.
    """

    prompt_tokens: int
    chat: ToolChat | None = None


@dataclass(frozen=True, slots=True)
class Token:
    """One step of the generation (see `sampler_worker.generate.Step`)."""

    step: Step


@dataclass(frozen=True, slots=True)
class Finished:
    """The generation ended (an end-of-generation token, the token budget, a stop string)."""

    generation: Generation


@dataclass(frozen=True, slots=True)
class Failed:
    """The generation could not start or go on; `error` says why."""

    error: BaseException


Event = Started | Token | Finished | Failed


class _Tally:
    # What one run cost, filled by its worker thread and read on the loop once the thread has ended: the
    # generation counts into `counters` as it goes (waits on constraintd included), so a cancelled run
    # is counted too; `constraint_seconds` is the session's opening and closing.
    __slots__ = ("constraint_seconds", "counters", "prompt_tokens", "rejections", "stopped", "tokens")

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.tokens = 0
        self.rejections = 0
        self.constraint_seconds = 0.0
        self.counters = Counters()
        self.stopped = False


class Run:
    """One generation: its events, in order, on the event loop; `cancel()` ends it at its next token."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._reasoning_end = threading.Event()
        self.deadline = deadline
        self.tally = _Tally()
        self.id = uuid.uuid4().hex  # the answer's id is "chatcmpl-" (or "cmpl-") and this
        self.controlled = False  # the request armed reasoning control and got a budget (set when prepared)

    def cancel(self) -> None:
        """End the generation at its next token (idempotent; nothing once it has ended)."""
        self._cancelled.set()

    def end_reasoning(self) -> bool:
        """Ask the generation to end its thinking block before its next token (`POST
        /v1/chat/completions/control`, action `reasoning_end`); False where the request did not arm it."""
        if not self.controlled:
            return False
        self._reasoning_end.set()
        return True

    def take_reasoning_end(self) -> bool:
        # the worker thread's: whether an end was asked since it last looked
        if not self._reasoning_end.is_set():
            return False
        self._reasoning_end.clear()
        return True

    async def next(self) -> Event:
        """The next event (waits for it)."""
        return await self._events.get()

    async def events(self) -> AsyncIterator[Event]:
        """Every event to the last (`Finished` or `Failed`)."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, Finished | Failed):
                return

    # The worker thread's side.

    def emit(self, event: Event) -> None:
        self.on_loop(self._events.put_nowait, event)

    def on_loop(self, call: Callable[..., object], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone, nobody listens
            self._loop.call_soon_threadsafe(call, *args)

    def check(self) -> None:
        if self._cancelled.is_set():
            raise _Stopped("cancelled")
        if time.monotonic() > self.deadline:
            raise DeadlinePassed("the request's deadline passed during its generation")


class Generations:
    """n model contexts behind a bounded queue; each generation on a worker thread of its own.

    Args:
        contexts: the slots (see `sampler_worker.serve.contexts`): the model, or the sequences of one batched
            context; one generation each at a time.
        client: a constraintd client (`clients.Client`), used from the worker threads.
        vocab: the model's vocabulary, registered with that client.
        max_queue: requests that may wait for a free context; one more is refused (`QueueFull`).
        metrics: where results are counted.
        overlap: how each generation meets constraintd (`sampler_worker.generate`'s modes).
        template: a chat template that replaces the model's (llama-server's --chat-template-file).
        reasoning_budget, reasoning_budget_message: a chat's reasoning budget and message when its request
            sets none (llama-server's --reasoning-budget, --reasoning-budget-message).
    """

    def __init__(
        self,
        contexts: Sequence[Model] | Sequence[Slot],
        *,
        client: Any,
        vocab: Any,
        max_queue: int,
        metrics: Metrics,
        overlap: Overlap = "auto",
        template: str | None = None,
        reasoning_budget: int = -1,
        reasoning_budget_message: str = "",
    ) -> None:
        if not contexts:
            raise ValueError("at least one context is needed")
        self.contexts: tuple[Model | Slot, ...] = tuple(contexts)
        self._free: list[Model | Slot] = list(contexts)
        self._waiters: deque[asyncio.Future[Model | Slot]] = deque()
        # one stepping thread per batched context (slot.batched)
        self._locksteps = {
            id(slot.batched): Lockstep(slot.batched, client=client, overlap=_batched_overlap(overlap))
            for slot in self.contexts if isinstance(slot, Slot)
        }
        self.client = client
        self._vocab = vocab
        self.max_queue = max_queue
        self.metrics = metrics
        self.overlap: Overlap = overlap
        self.template = template
        self.reasoning_budget = reasoning_budget
        self.reasoning_budget_message = reasoning_budget_message
        self._runs: set[Run] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._executor = ThreadPoolExecutor(max_workers=len(contexts), thread_name_prefix="generation")

    async def start(self, job: Job, *, deadline: float) -> Run:
        """Start `job` once a context is free.

        Args:
            job: what to generate.
            deadline: `time.monotonic()` time by which the generation must have ended.

        Raises:
            QueueFull: no context is free and `max_queue` requests are waiting already.
            DeadlinePassed: no context came free before the deadline.
        """
        context = await self._acquire(deadline)
        loop = asyncio.get_running_loop()
        run = Run(loop, deadline)
        self._runs.add(run)
        self._idle.clear()
        self.metrics.active += 1
        future = loop.run_in_executor(self._executor, self._work, context, job, run)
        future.add_done_callback(lambda _: self._ended(context, run))
        return run

    def control(self, completion_id: str, action: str) -> dict[str, Any]:
        """llama-server's answer to a control of a running completion (`POST /v1/chat/completions/control`):
        `reasoning_end` ends its thinking block before its next token, where its request set
        `reasoning_control` and it runs a reasoning budget.

        Raises:
            RequestError: no completion id, or an action other than reasoning_end.
        """
        if not completion_id:
            raise RequestError("missing completion id", param="id")
        if action != "reasoning_end":
            raise RequestError("unknown control action", param="action")
        run = next((run for run in self._runs if f"chatcmpl-{run.id}" == completion_id), None)
        if run is None:
            return {"success": False, "message": "no active completion for this id"}
        if not run.end_reasoning():
            return {"success": False, "message": "reasoning control not enabled for this completion"}
        return {"success": True}

    async def wait_idle(self) -> None:
        """Wait until no generation runs (every worker thread has ended)."""
        await self._idle.wait()

    def cancel_all(self) -> None:
        """End every running generation at its next token."""
        for run in self._runs:
            run.cancel()

    def close(self) -> None:
        """Cancel every generation and wait for the worker threads (blocks; call at shutdown)."""
        self.cancel_all()
        self._executor.shutdown(wait=True)
        for lockstep in self._locksteps.values():
            lockstep.close()

    async def _acquire(self, deadline: float) -> Model | Slot:
        if self._free:
            return self._free.pop(self._least_busy())
        if len(self._waiters) >= self.max_queue:
            self.metrics.queue_full += 1
            raise QueueFull(retry_after=1)
        waiter: asyncio.Future[Model | Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.metrics.waiting += 1
        owned = False
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                context = await waiter
            owned = True
            return context
        except TimeoutError:
            raise DeadlinePassed("the request's deadline passed while it waited for a free slot") from None
        finally:
            self.metrics.waiting -= 1
            if not owned:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                if waiter.done() and not waiter.cancelled():
                    # handed a context just as the wait ended (deadline, client gone): pass it on
                    self._release(waiter.result())
                else:
                    waiter.cancel()

    def _least_busy(self) -> int:
        # the free slot whose batched context has the most free slots: generations spread over the
        # contexts (their threads) before they share one
        free: dict[int, int] = {}
        for slot in self._free:
            if isinstance(slot, Slot):
                free[id(slot.batched)] = free.get(id(slot.batched), 0) + 1
        if not free:
            return len(self._free) - 1
        return max(range(len(self._free)),
                   key=lambda i: free.get(id(getattr(self._free[i], "batched", None)), 0))

    def _release(self, context: Model | Slot) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(context)
                return
        self._free.append(context)

    def _ended(self, context: Model | Slot, run: Run) -> None:
        # on the loop, once the worker thread has ended
        tally = run.tally
        metrics = self.metrics
        metrics.active -= 1
        metrics.prompt_tokens += tally.prompt_tokens
        metrics.generated_tokens += tally.tokens
        metrics.rejections += tally.rejections
        metrics.constraintd_seconds += tally.constraint_seconds + tally.counters.constraint_seconds
        metrics.cancelled += tally.stopped
        self._runs.discard(run)
        if not self._runs:
            self._idle.set()
        self._release(context)

    # The worker thread.

    def _tokens(self, context: Model | Slot, job: Job) -> list[int]:
        text = job.prompt if job.chat is None else chat_text(context, job.chat, template=self.template)
        return context.tokenize(text, add_special=True, parse_special=True)

    @staticmethod
    def _check_prompt(context: Model | Slot, tokens: list[int]) -> None:
        if not tokens:
            raise RequestError("the prompt has no tokens", param="prompt")
        if len(tokens) >= context.n_ctx:
            raise ContextLengthError(
                f"the prompt has {len(tokens)} tokens; the context holds {context.n_ctx}", param="messages"
            )

    @contextlib.contextmanager
    def _prepared(
        self, context: Model | Slot, job: Job, run: Run
    ) -> Iterator[tuple[list[int], ToolChat | None, Session | None, ReasoningBudget | None, list[str],
                        frozenset[int]]]:
        # The prompt's tokens, the chat with tools (None without), the open session (None: no constraint),
        # the reasoning budget, the stop strings and the tokens whose text is written: a chat with tools, or
        # an OpenAI chat with a response schema, gets its session from the service with its prompt (the
        # template's stops added); any other request's prompt is checked before its session opens.
        if job.tools is None and job.chat_schema is not None:
            made: ToolChat | None = None
            schema = job.chat_schema
            messages = tuple(TemplateMessage(message.role, message.content) for message in job.chat or ())

            def open_schema_chat() -> Session | None:
                nonlocal made
                made = tool_chat(self.client, self._vocab, context, messages, [], template=self.template,
                                 json_schema=schema)
                return made.session

            with self._session(open_schema_chat, run) as session:
                assert made is not None
                self._check_prompt(context, made.prompt)
                made.read("")  # as a chat with tools: a parser not ported says so before the generation
                # the answer is the chat parser's message: the thinking block, then the content rule's value
                yield (made.prompt, made, session, self._budget(context, job, made.settings, run),
                       made.stop_strings(job.stop), made.preserved)
            return
        if job.tools is None:
            tokens = self._tokens(context, job)
            self._check_prompt(context, tokens)
            budget = None
            if job.chat is not None and (self._budget_tokens(job) >= 0 or job.reasoning_control):
                # its thinking tags are the chat params' (no grammar to hold: the engine's own reading)
                thinking = [TemplateMessage(message.role, message.content) for message in job.chat]
                budget = self._budget(context, job, chat_settings(context, thinking, template=self.template),
                                      run)
            with self._session(lambda: None if job.constraint is None else
                               self.client.session(self._vocab, **job.constraint), run) as session:
                yield tokens, None, session, budget, list(job.stop), frozenset()
            return
        asked = job.tools
        chat: ToolChat | None = None

        def open_chat() -> Session | None:
            nonlocal chat
            chat = tool_chat(self.client, self._vocab, context, asked.messages, asked.tools,
                             tool_choice=asked.tool_choice, parallel_tool_calls=asked.parallel_tool_calls,
                             template=self.template)
            return chat.session

        with self._session(open_chat, run) as session:
            assert chat is not None
            self._check_prompt(context, chat.prompt)
            # a parser not ported for the format says so on any text: before the generation, not after it
            chat.read("")
            yield (chat.prompt, chat, session, self._budget(context, job, chat.settings, run),
                   chat.stop_strings(job.stop), chat.preserved)

    def _budget_tokens(self, job: Job) -> int:
        if job.reasoning_budget is None:  # not an OpenAI chat completion: none
            return -1
        return self.reasoning_budget if job.reasoning_budget == -1 else job.reasoning_budget

    def _budget(
        self, context: Model | Slot, job: Job, settings: ChatSettings, run: Run
    ) -> ReasoningBudget | None:
        # the chat's reasoning budget (None: llama-server runs none); the run is told whether it may be
        # ended by a control
        message = job.reasoning_budget_message
        budget = reasoning_budget(
            settings, context.model if isinstance(context, Slot) else context, self._budget_tokens(job),
            self.reasoning_budget_message if message is None else message, control=job.reasoning_control)
        run.controlled = job.reasoning_control and budget is not None
        return budget

    def _work(self, context: Model | Slot, job: Job, run: Run) -> None:
        tally = run.tally
        try:
            run.check()
            with self._prepared(context, job, run) as (prompt, chat, session, reasoning, stop, special):
                tally.prompt_tokens = len(prompt)
                room = context.n_ctx - len(prompt)
                budget = room if job.max_tokens is None else min(job.max_tokens, room)
                run.check()
                run.emit(Started(len(prompt), chat))

                def on_step(step: Step) -> None:
                    if step.token is not None:
                        tally.tokens += 1
                        tally.rejections += step.rejected
                    run.emit(Token(step))
                    run.check()

                def check() -> None:
                    # before each decode, on the thread that samples: a control's end of the thinking block
                    run.check()
                    if reasoning is not None and run.take_reasoning_end():
                        reasoning.force()  # llama-server's too: nothing where the block is not counting

                if isinstance(context, Slot):
                    generation = self._locksteps[id(context.batched)].generate(
                        context, prompt, job.settings, session=session, max_tokens=budget, stop=stop,
                        on_step=on_step, check=check, counters=tally.counters, special=special,
                        budget=reasoning, grammar_lazy=chat is not None and chat.settings.grammar_lazy,
                    )
                else:
                    generation = generate(
                        context, prompt, job.settings, session=session, max_tokens=budget, stop=stop,
                        on_step=on_step, overlap=self.overlap, counters=tally.counters, check=check,
                        special=special, budget=reasoning,
                        grammar_lazy=chat is not None and chat.settings.grammar_lazy,
                    )
            run.emit(Finished(generation))
        except _Stopped as exc:
            tally.stopped = True
            run.emit(Failed(exc))
        except DeadlinePassed as exc:
            tally.stopped = True
            run.emit(Failed(exc))
        except BaseException as exc:
            run.emit(Failed(exc))

    @contextlib.contextmanager
    def _session(self, open_session: Callable[[], Session | None], run: Run) -> Iterator[Session | None]:
        # opens the session (timed, counted while open) and closes it whatever happens
        tally = run.tally
        started = time.perf_counter()
        session = open_session()
        tally.constraint_seconds += time.perf_counter() - started
        if session is None:
            yield None
            return
        run.on_loop(self._count_session, 1)
        try:
            yield session
        finally:
            started = time.perf_counter()
            try:
                session.close()
            finally:
                tally.constraint_seconds += time.perf_counter() - started
                run.on_loop(self._count_session, -1)

    def _count_session(self, change: int) -> None:
        # on the loop
        self.metrics.constraintd_sessions += change

