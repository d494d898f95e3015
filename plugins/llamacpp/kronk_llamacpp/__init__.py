"""llama.cpp backend for Kronk."""
