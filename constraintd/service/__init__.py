"""The service core: sessions over the engine, with no grpc and no asyncio.

    registry      vocabularies and compiled grammars, content-addressed and shared by every session
    sessions      the session store: ids, idle TTLs, limits
    operations    every RPC of constraintd.v1 as a function of its request message (decode, engine, encode)
    status        an error as the google.rpc.Status it goes on the wire as (code, message, details)
    constraints   what a session is asked to follow (GBNF, JSON schema, JSON mode, a request body) -> GBNF
    limits        the bounds the service keeps, whatever its callers send
    vocab_store   prepared vocabularies on disk (`constraintd warm`, `serve --cache-dir`)
    log_events    the event-and-fields shape of the service's logs

Both front-ends use it as it is: the gRPC shell (`constraintd.server`) on its event loop and worker threads,
and the client's in-process transport (`clients.transports.local`) on the caller's thread. Importing this
package imports nothing else.
"""
