"""Chat templates for Kronk."""
