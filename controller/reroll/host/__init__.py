"""Host-side child processes: the LLM proxy, HTTPS interception, the Toxiproxy server, reroll's cache."""
