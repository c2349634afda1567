"""The gRPC shell around the service core (`constraintd.service`): the only package that imports grpc.

    servicer   the grpc.aio servicer, and the one mapping of errors to statuses
    lifecycle  startup, serve, shutdown; signals; uvloop
    workers    threads that run slow work (compiles, masks) off the event loop, with a time limit
    processes  worker processes for the vocabulary-free half of a compile
    health, metrics, security, logs, config

Importing this package imports nothing else; import the module you need (`constraintd.server.lifecycle`
to run a server).
"""
