"""The runtime: loading models, the pool, the batch engine and speculation."""
