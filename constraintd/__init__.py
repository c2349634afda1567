"""constraintd: grammar-constrained decoding as a service.

The engine (`constraintd.engine`) is llama.cpp's GBNF engine and JSON-schema converter in Python, with no
I/O; the server (`constraintd.server`) serves it over gRPC; `clients` and `sampler_worker` are its users.
"""

from constraintd.errors import ConstraintdError

__all__ = ["ConstraintdError", "__version__"]

__version__ = "0.1.0"
