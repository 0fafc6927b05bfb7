"""Where things are inside a sandbox by default, as Harbor and BenchFlow lay a task out: the
task's loader (`reroll.tasks.task`) and the backends' spec (`reroll.sandbox.spec`) both read them."""

DEFAULT_WORKDIR = "/app"
"""The agent's working folder when neither the task nor its image's WORKDIR names one."""
LOGS_MOUNT = "/logs"
"""The logs folder (``agent/``, ``verifier/``) when the task names none."""
