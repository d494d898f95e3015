"""Kronk plugin: the browser UI, served from the API port."""
