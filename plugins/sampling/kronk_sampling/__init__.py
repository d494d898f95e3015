"""The default sampler-stage order for Kronk."""
