"""The rollout lifecycle: record, continue, replay, checkpoints, scenes and the verifier's host side."""
