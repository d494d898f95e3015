"""Kronk plugin: JWT authentication, endpoint grants and rate limits."""
