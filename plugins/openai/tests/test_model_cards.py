"""GET /v1/models/{id} finds an id or alias that holds a `/` (`org/model`, as agents and
gateways name models), as GET /v1/models lists it; on the scripted model."""

from __future__ import annotations

import httpx

from kronk_testing.plugin import MakeServer, ScriptedKronk


def test_an_id_with_a_slash_is_one_model(
    scripted_kronk: ScriptedKronk, make_server: MakeServer
) -> None:
    kronk = scripted_kronk({"org/model": {"aliases": ["openai/gpt-4o"]}})
    server = make_server(kronk)
    listed = {card["id"] for card in httpx.get(f"{server.base_url}/v1/models").json()["data"]}
    assert {"org/model", "openai/gpt-4o"} <= listed
    card = httpx.get(f"{server.base_url}/v1/models/org/model")
    assert card.status_code == 200, card.text
    assert card.json()["id"] == "org/model"
    alias = httpx.get(f"{server.base_url}/v1/models/openai/gpt-4o").json()
    assert (alias["id"], alias["alias_of"]) == ("openai/gpt-4o", "org/model")
    missing = httpx.get(f"{server.base_url}/v1/models/org/other")
    assert missing.status_code == 404
    assert "model 'org/other' not found" in missing.json()["error"]["message"]
