"""KV cache strategies for Kronk."""
