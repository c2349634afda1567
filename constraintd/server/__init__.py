"""The constraintd service: the engine behind gRPC (with the generated stubs, the only code importing grpc).

    registry      vocabularies and compiled grammars, content-addressed and shared
    sessions      the session store: ids, idle TTLs, limits
    operations    every RPC as a function of its request message (no grpc: the in-process client uses it)
    servicer      the grpc.aio servicer, and the one mapping of errors to statuses
    lifecycle     startup, serve, shutdown; signals; uvloop
    health, metrics, security, workers, logs, config

Importing this package imports nothing else; import the module you need (`constraintd.server.lifecycle`
to run a server), so that the in-process transport can use the registry and sessions without grpc.
"""
