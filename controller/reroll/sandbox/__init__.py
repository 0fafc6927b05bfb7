"""Sandbox backends: the `Sandbox` protocol, the sidecar client and the `local` backend."""
