"""HTTP clients of model servers, shared by the LLM judge and rollout's server policies: the retry policy as data
(`retry`), a pool of servers with session-sticky routing and failover (`router`) and the OpenAI-compatible chat client
(`openai_chat`). They sit in prm, the lowest layer that uses them; rollout.policy builds its sglang and openai policies
on them."""
