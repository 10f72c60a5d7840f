"""The development inference server, `python -m rollout.server` (this package's `__main__`): OpenAI chat completions
and SGLang's native API over a local model (`app`: the app, `ServerThread` / `ServerProcess`, the command line), with
its model backends (`backends`: HF, replay, fixed)."""
