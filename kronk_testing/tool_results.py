"""Tool results that must reach the prompt: the same conversation with a longer result has a
prompt longer by exactly the tokens added to the result (a dialect's tests append MORE to a
tool result and compare the two prompts' `prompt_tokens` with `tokens_of_more`)."""

from __future__ import annotations

# Appended to a tool result. It starts with a space and the template closes the result with
# a special token, so its tokens are the same alone as inside the prompt.
MORE = " Wind from the west at 12 km/h, gusting to 30 in the afternoon."


def tokens_of_more(base_url: str, model: str) -> int:
    """How many tokens MORE is, as the server's tokenizer counts them (`POST /v1/tokenize`)."""
    import httpx

    response = httpx.post(
        f"{base_url}/v1/tokenize", json={"model": model, "input": MORE}, timeout=120
    )
    assert response.status_code == 200, response.text
    count = response.json()["tokens"]
    assert isinstance(count, int) and count > 10
    return count
