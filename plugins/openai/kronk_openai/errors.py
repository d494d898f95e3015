"""KronkError → OpenAI's error shape: the server's own shape (kronk_api.dialect)."""

from __future__ import annotations

from kronk_api.contract import Dialect

OPENAI = Dialect()
