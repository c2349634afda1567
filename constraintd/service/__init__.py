"""The service core: sessions over the engine, with no grpc and no asyncio.

    registry      vocabularies and compiled grammars, content-addressed and shared by every session
    sessions      the session store: ids, idle TTLs, limits
    operations    every RPC of constraintd.v1 as a function of its request message (decode, engine, encode)
    status        an error as the google.rpc.Status it goes on the wire as (code, message, details)
    constraints   what a session is asked to follow (GBNF, JSON schema, JSON mode, a request body, a chat
                  request) -> GBNF
    chat          a chat request resolved as llama-server resolves one (prompt, chat params, triggers), and
                  the settings its caller needs to run the generation and parse the answer
    limits        the bounds the service keeps, whatever its callers send
    vocab_store   prepared vocabularies on disk (`constraintd warm`, `serve --cache-dir`)
    log_events    the event-and-fields shape of the service's logs

Both front-ends use it as it is: the gRPC shell (`constraintd.server`) on its event loop and worker threads,
and the client's in-process transport (`clients.transports.local`) on the caller's thread. Importing this
package imports nothing else. Chat requests are rendered with constraintd.chat_templates (Jinja2, imported
at the first render).
"""
