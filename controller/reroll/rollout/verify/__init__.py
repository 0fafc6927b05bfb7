"""How a rollout is scored: the `Verifier` seam and its registry (`verifiers`), the test-script
verifier (`script_verifier`), the LLM judge over a rubric (`judge`) and the agent judge
(`agent_judge`)."""
