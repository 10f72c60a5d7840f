"""The tool-call family: ToolCallEnv (envs.toolcall.env), its tasks, tools, parser, interpreter and grading.

Kept import-free so that `import envs.toolcall.tasks` does not load the env, math-verify or gymnasium.
"""
