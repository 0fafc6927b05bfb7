"""Models: specs and providers, and the bundled scripted model server."""
