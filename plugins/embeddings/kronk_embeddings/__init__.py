"""Embeddings and rerank endpoints for Kronk."""
