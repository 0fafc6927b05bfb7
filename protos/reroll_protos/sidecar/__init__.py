"""Generated gRPC code for the reroll sidecar contract (see sidecar.proto)."""
