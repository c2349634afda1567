from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterVocabRequest(_message.Message):
    __slots__ = ("pieces", "gguf_path")
    PIECES_FIELD_NUMBER: _ClassVar[int]
    GGUF_PATH_FIELD_NUMBER: _ClassVar[int]
    pieces: PieceList
    gguf_path: str
    def __init__(self, pieces: _Optional[_Union[PieceList, _Mapping]] = ..., gguf_path: _Optional[str] = ...) -> None: ...

class PieceList(_message.Message):
    __slots__ = ("pieces", "eog", "token_texts", "token_attrs", "tokenizer")
    PIECES_FIELD_NUMBER: _ClassVar[int]
    EOG_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TEXTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ATTRS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    pieces: _containers.RepeatedScalarFieldContainer[bytes]
    eog: _containers.RepeatedScalarFieldContainer[int]
    token_texts: _containers.RepeatedScalarFieldContainer[str]
    token_attrs: _containers.RepeatedScalarFieldContainer[int]
    tokenizer: Tokenizer
    def __init__(self, pieces: _Optional[_Iterable[bytes]] = ..., eog: _Optional[_Iterable[int]] = ..., token_texts: _Optional[_Iterable[str]] = ..., token_attrs: _Optional[_Iterable[int]] = ..., tokenizer: _Optional[_Union[Tokenizer, _Mapping]] = ...) -> None: ...

class Tokenizer(_message.Message):
    __slots__ = ("model", "add_space_prefix", "escape_whitespaces")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADD_SPACE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ESCAPE_WHITESPACES_FIELD_NUMBER: _ClassVar[int]
    model: str
    add_space_prefix: bool
    escape_whitespaces: bool
    def __init__(self, model: _Optional[str] = ..., add_space_prefix: _Optional[bool] = ..., escape_whitespaces: _Optional[bool] = ...) -> None: ...

class RegisterVocabResponse(_message.Message):
    __slots__ = ("vocab_id", "size", "content_hash")
    VOCAB_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    vocab_id: str
    size: int
    content_hash: str
    def __init__(self, vocab_id: _Optional[str] = ..., size: _Optional[int] = ..., content_hash: _Optional[str] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("vocab_id", "gbnf", "json_schema", "json_object", "openai_request", "ollama_request", "chat", "options", "replay", "strict", "schema_dialect")
    VOCAB_ID_FIELD_NUMBER: _ClassVar[int]
    GBNF_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    OPENAI_REQUEST_FIELD_NUMBER: _ClassVar[int]
    OLLAMA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_DIALECT_FIELD_NUMBER: _ClassVar[int]
    vocab_id: str
    gbnf: Gbnf
    json_schema: str
    json_object: JsonObject
    openai_request: str
    ollama_request: str
    chat: ChatRequest
    options: SessionOptions
    replay: _containers.RepeatedScalarFieldContainer[int]
    strict: bool
    schema_dialect: str
    def __init__(self, vocab_id: _Optional[str] = ..., gbnf: _Optional[_Union[Gbnf, _Mapping]] = ..., json_schema: _Optional[str] = ..., json_object: _Optional[_Union[JsonObject, _Mapping]] = ..., openai_request: _Optional[str] = ..., ollama_request: _Optional[str] = ..., chat: _Optional[_Union[ChatRequest, _Mapping]] = ..., options: _Optional[_Union[SessionOptions, _Mapping]] = ..., replay: _Optional[_Iterable[int]] = ..., strict: _Optional[bool] = ..., schema_dialect: _Optional[str] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("template", "messages", "tools", "tool_choice", "parallel_tool_calls", "json_schema", "reasoning_format", "enable_thinking", "bos_text", "eos_text", "add_bos", "add_eos", "now")
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REASONING_FORMAT_FIELD_NUMBER: _ClassVar[int]
    ENABLE_THINKING_FIELD_NUMBER: _ClassVar[int]
    BOS_TEXT_FIELD_NUMBER: _ClassVar[int]
    EOS_TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_BOS_FIELD_NUMBER: _ClassVar[int]
    ADD_EOS_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    template: str
    messages: str
    tools: str
    tool_choice: str
    parallel_tool_calls: bool
    json_schema: str
    reasoning_format: str
    enable_thinking: bool
    bos_text: str
    eos_text: str
    add_bos: bool
    add_eos: bool
    now: float
    def __init__(self, template: _Optional[str] = ..., messages: _Optional[str] = ..., tools: _Optional[str] = ..., tool_choice: _Optional[str] = ..., parallel_tool_calls: _Optional[bool] = ..., json_schema: _Optional[str] = ..., reasoning_format: _Optional[str] = ..., enable_thinking: _Optional[bool] = ..., bos_text: _Optional[str] = ..., eos_text: _Optional[str] = ..., add_bos: _Optional[bool] = ..., add_eos: _Optional[bool] = ..., now: _Optional[float] = ...) -> None: ...

class Gbnf(_message.Message):
    __slots__ = ("text", "root")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    text: str
    root: str
    def __init__(self, text: _Optional[str] = ..., root: _Optional[str] = ...) -> None: ...

class JsonObject(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionOptions(_message.Message):
    __slots__ = ("trigger_patterns", "trigger_tokens", "prefill", "ttl_seconds")
    TRIGGER_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    trigger_patterns: _containers.RepeatedScalarFieldContainer[str]
    trigger_tokens: _containers.RepeatedScalarFieldContainer[int]
    prefill: bytes
    ttl_seconds: int
    def __init__(self, trigger_patterns: _Optional[_Iterable[str]] = ..., trigger_tokens: _Optional[_Iterable[int]] = ..., prefill: _Optional[bytes] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class SessionState(_message.Message):
    __slots__ = ("complete", "position")
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    position: int
    def __init__(self, complete: _Optional[bool] = ..., position: _Optional[int] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session_id", "warnings", "state", "vocab_size", "chat")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    state: SessionState
    vocab_size: int
    chat: ChatSettings
    def __init__(self, session_id: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ..., vocab_size: _Optional[int] = ..., chat: _Optional[_Union[ChatSettings, _Mapping]] = ...) -> None: ...

class ChatSettings(_message.Message):
    __slots__ = ("prompt", "generation_prompt", "grammar", "grammar_lazy", "trigger_patterns", "trigger_tokens", "preserved_tokens", "additional_stops", "supports_thinking", "thinking_start_tag", "thinking_end_tags", "prefill", "parser")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_LAZY_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRESERVED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADDITIONAL_STOPS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_THINKING_FIELD_NUMBER: _ClassVar[int]
    THINKING_START_TAG_FIELD_NUMBER: _ClassVar[int]
    THINKING_END_TAGS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    PARSER_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    generation_prompt: str
    grammar: str
    grammar_lazy: bool
    trigger_patterns: _containers.RepeatedScalarFieldContainer[str]
    trigger_tokens: _containers.RepeatedScalarFieldContainer[int]
    preserved_tokens: _containers.RepeatedScalarFieldContainer[str]
    additional_stops: _containers.RepeatedScalarFieldContainer[str]
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: _containers.RepeatedScalarFieldContainer[str]
    prefill: bytes
    parser: str
    def __init__(self, prompt: _Optional[str] = ..., generation_prompt: _Optional[str] = ..., grammar: _Optional[str] = ..., grammar_lazy: _Optional[bool] = ..., trigger_patterns: _Optional[_Iterable[str]] = ..., trigger_tokens: _Optional[_Iterable[int]] = ..., preserved_tokens: _Optional[_Iterable[str]] = ..., additional_stops: _Optional[_Iterable[str]] = ..., supports_thinking: _Optional[bool] = ..., thinking_start_tag: _Optional[str] = ..., thinking_end_tags: _Optional[_Iterable[str]] = ..., prefill: _Optional[bytes] = ..., parser: _Optional[str] = ...) -> None: ...

class Mask(_message.Message):
    __slots__ = ("words", "vocab_size", "allowed", "all_allowed")
    WORDS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    ALL_ALLOWED_FIELD_NUMBER: _ClassVar[int]
    words: bytes
    vocab_size: int
    allowed: int
    all_allowed: bool
    def __init__(self, words: _Optional[bytes] = ..., vocab_size: _Optional[int] = ..., allowed: _Optional[int] = ..., all_allowed: _Optional[bool] = ...) -> None: ...

class AcceptRequest(_message.Message):
    __slots__ = ("session_id", "token", "mask_on_reject", "position", "mask_after")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MASK_ON_REJECT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    MASK_AFTER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token: int
    mask_on_reject: bool
    position: int
    mask_after: bool
    def __init__(self, session_id: _Optional[str] = ..., token: _Optional[int] = ..., mask_on_reject: _Optional[bool] = ..., position: _Optional[int] = ..., mask_after: _Optional[bool] = ...) -> None: ...

class AcceptResponse(_message.Message):
    __slots__ = ("accepted", "state", "mask")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    state: SessionState
    mask: Mask
    def __init__(self, accepted: _Optional[bool] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ..., mask: _Optional[_Union[Mask, _Mapping]] = ...) -> None: ...

class AllowsRequest(_message.Message):
    __slots__ = ("session_id", "tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class AllowsResponse(_message.Message):
    __slots__ = ("allowed", "state")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    allowed: _containers.RepeatedScalarFieldContainer[bool]
    state: SessionState
    def __init__(self, allowed: _Optional[_Iterable[bool]] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ...) -> None: ...

class MaskRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class MaskResponse(_message.Message):
    __slots__ = ("mask", "state")
    MASK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    mask: Mask
    state: SessionState
    def __init__(self, mask: _Optional[_Union[Mask, _Mapping]] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("session_id", "count", "position")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    count: int
    position: int
    def __init__(self, session_id: _Optional[str] = ..., count: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: SessionState
    def __init__(self, state: _Optional[_Union[SessionState, _Mapping]] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("session_id", "position")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    position: int
    def __init__(self, session_id: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("session_id", "state")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state: SessionState
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[_Union[SessionState, _Mapping]] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("ops", "accepts")
    OPS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[StepOp]
    accepts: AcceptBatch
    def __init__(self, ops: _Optional[_Iterable[_Union[StepOp, _Mapping]]] = ..., accepts: _Optional[_Union[AcceptBatch, _Mapping]] = ...) -> None: ...

class AcceptBatch(_message.Message):
    __slots__ = ("session_ids", "tokens", "positions", "mask_on_reject", "mask_after")
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MASK_ON_REJECT_FIELD_NUMBER: _ClassVar[int]
    MASK_AFTER_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    mask_on_reject: bool
    mask_after: bool
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ..., tokens: _Optional[_Iterable[int]] = ..., positions: _Optional[_Iterable[int]] = ..., mask_on_reject: _Optional[bool] = ..., mask_after: _Optional[bool] = ...) -> None: ...

class StepOp(_message.Message):
    __slots__ = ("accept", "mask", "allows")
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    ALLOWS_FIELD_NUMBER: _ClassVar[int]
    accept: AcceptRequest
    mask: MaskRequest
    allows: AllowsRequest
    def __init__(self, accept: _Optional[_Union[AcceptRequest, _Mapping]] = ..., mask: _Optional[_Union[MaskRequest, _Mapping]] = ..., allows: _Optional[_Union[AllowsRequest, _Mapping]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("results", "accepts")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StepResult]
    accepts: AcceptBatchResponse
    def __init__(self, results: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ..., accepts: _Optional[_Union[AcceptBatchResponse, _Mapping]] = ...) -> None: ...

class AcceptBatchResponse(_message.Message):
    __slots__ = ("accepted", "complete", "errors", "masks")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    MASKS_FIELD_NUMBER: _ClassVar[int]
    accepted: _containers.RepeatedScalarFieldContainer[bool]
    complete: _containers.RepeatedScalarFieldContainer[bool]
    errors: _containers.RepeatedCompositeFieldContainer[ItemError]
    masks: _containers.RepeatedCompositeFieldContainer[ItemMask]
    def __init__(self, accepted: _Optional[_Iterable[bool]] = ..., complete: _Optional[_Iterable[bool]] = ..., errors: _Optional[_Iterable[_Union[ItemError, _Mapping]]] = ..., masks: _Optional[_Iterable[_Union[ItemMask, _Mapping]]] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("index", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    error: _status_pb2.Status
    def __init__(self, index: _Optional[int] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class ItemMask(_message.Message):
    __slots__ = ("index", "mask")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    index: int
    mask: Mask
    def __init__(self, index: _Optional[int] = ..., mask: _Optional[_Union[Mask, _Mapping]] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("accept", "mask", "allows", "error")
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    ALLOWS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    accept: AcceptResponse
    mask: MaskResponse
    allows: AllowsResponse
    error: _status_pb2.Status
    def __init__(self, accept: _Optional[_Union[AcceptResponse, _Mapping]] = ..., mask: _Optional[_Union[MaskResponse, _Mapping]] = ..., allows: _Optional[_Union[AllowsResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...
