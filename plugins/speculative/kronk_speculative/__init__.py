"""Kronk plugin: speculative decoding strategies (draft model, prompt lookup)."""
