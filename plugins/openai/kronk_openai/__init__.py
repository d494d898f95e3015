"""The OpenAI API dialect for Kronk."""
