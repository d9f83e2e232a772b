"""The vLLM backends: offline (`offline.VLLMBackend`), a server (`serve.VLLMServeBackend`) and a launched server
(`launch`), their shared token-engine half (`engine`, `lowering`, `loop`), per-request steering inside the engine
(`steering` on the client side, `plugin` in vLLM's worker processes) and vectors fitted for an engine (`fit`).

Nothing here imports vLLM at module level: it is imported inside the functions that boot an engine.
"""
