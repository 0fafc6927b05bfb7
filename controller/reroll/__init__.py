"""reroll: run unmodified LLM agents in sandboxes, record every LLM exchange, replay and continue runs."""

__version__ = "0.1.0"
