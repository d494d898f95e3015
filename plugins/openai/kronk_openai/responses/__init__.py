"""OpenAI's Responses API: its routes, request schemas, error shape, answers and store."""
