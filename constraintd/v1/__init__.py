"""The wire contract, generated from `proto/constraintd/v1/constraintd.proto` (package `constraintd.v1`).

`constraintd_pb2` holds the messages, `constraintd_pb2_grpc` the service stubs. Regenerate with

    python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. \
        proto/constraintd/v1/constraintd.proto

and never edit them by hand: `tests/server/test_wire.py` regenerates them and compares.
"""
