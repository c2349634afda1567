"""The wire contract, generated from `proto/constraintd/v1/constraintd.proto` (package `constraintd.v1`).

`constraintd_pb2` holds the messages, `constraintd_pb2_grpc` the service stubs. Errors are
`google.rpc.Status` messages (googleapis-common-protos, which ships google/rpc/*.proto in site-packages).
Regenerate with

    rpc=$(python -c 'import google.rpc as rpc, pathlib; print(pathlib.Path(rpc.__path__[0]).parents[1])')
    python -m grpc_tools.protoc -I proto -I "$rpc" --python_out=. --pyi_out=. --grpc_python_out=. \
        proto/constraintd/v1/constraintd.proto

and never edit them by hand: `tests/server/test_wire.py` regenerates them and compares.
"""
