"""Kronk plugin: a catalog of verified models, and the downloads that pull them."""
