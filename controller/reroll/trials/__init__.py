"""Trials: scenes, roles, turns and Users (the trial file format and the User API)."""
