"""The `reroll` command line: one module per command group."""
