"""Kronk plugin: the Ollama API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/tags`, ...)."""
