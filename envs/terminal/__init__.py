"""The terminal family: shell tasks in a sandbox, graded by hidden tests (see envs.terminal.env)."""
