"""The swe family: SWE-bench instances solved with shell commands in a checkout, graded by swebench (see envs.swe.env)."""
