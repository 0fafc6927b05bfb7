"""The reroll sidecar: the gRPC daemon inside every sandbox (exec, files, kill).

Run it as ``python -m reroll_sidecar --listen unix:/path/s.sock`` with the auth token in
``REROLL_SIDECAR_TOKEN``; the contract is ``reroll_protos/sidecar/v1/sidecar.proto``. It depends
only on grpcio, protobuf, the standard library and `reroll_contracts.errors` (the exception tree, which
imports nothing; the sandbox image ships it beside this package), and runs on any Python 3.10+.
"""

__version__ = "0.1.0"
