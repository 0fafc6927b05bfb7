"""The run-folder format: every file name and model of a run, a job and a branch tree."""
