"""Who talks to the agent during a rollout: the turn scheduler that runs a trial's scenes, turns
and User rounds (`scenes`), a User played by a model (`persona`), and reroll's ``ask_user`` tool
with the answerer of its questions (`asks`, `ask_user_server`)."""
