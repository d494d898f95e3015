"""`ollama pull` and `ollama rm` on a Kronk server, through the official `ollama` client:
/api/pull fetches what the catalog can (a Hugging Face reference, from a local Hub here),
/api/delete removes what was pulled, as `kronk model rm` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from kronk_api import ServerSettings, create_app
from kronk_testing.hub_server import Hub, HubRepo
from kronk_testing.server import Serve

REFERENCE = "hf.co/org/Tiny-GGUF:Q8_0"
PULLED = "Tiny-Q8_0"


@pytest.fixture
def hub(tiny_llama_path: Path) -> Iterator[Hub]:
    with Hub() as running:
        running.repos["org/Tiny-GGUF"] = HubRepo({"Tiny-Q8_0.gguf": tiny_llama_path})
        yield running


@pytest.fixture
def base_url(
    tmp_path: Path, hub: Hub, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with serve(create_app(ServerSettings(base_path=tmp_path))) as base_url:
        yield base_url


def listed(client: ollama.Client) -> set[str]:
    return {model.model or "" for model in client.list().models}


def test_a_pull_fetches_the_reference_and_the_model_is_listed_and_answers(
    base_url: str, tmp_path: Path
) -> None:
    client = ollama.Client(host=base_url, timeout=60)
    assert client.pull(REFERENCE).status == "success"
    assert (tmp_path / "models" / "org" / "Tiny-GGUF" / "Tiny-Q8_0.gguf").is_file()
    assert f"{PULLED}:latest" in listed(client)
    answer = client.generate(PULLED, "Hello", options={"num_predict": 3, "temperature": 0})
    assert answer.done
    # Pulled again: it is on disk, so nothing is fetched and the answer is the same.
    assert client.pull(REFERENCE).status == "success"


def test_a_streamed_pull_says_what_it_pulls_then_success(base_url: str) -> None:
    client = ollama.Client(host=base_url, timeout=60)
    statuses = [progress.status for progress in client.pull(REFERENCE, stream=True)]
    assert statuses == [f"pulling {REFERENCE}", f"pulled {PULLED}", "success"]


def test_a_reference_nobody_serves_is_a_404_and_in_a_stream_an_error_line(base_url: str) -> None:
    client = ollama.Client(host=base_url, timeout=60)
    with pytest.raises(ollama.ResponseError) as refused:
        client.pull("hf.co/org/Missing-GGUF")
    assert refused.value.status_code == 404
    assert "has no model repository org/Missing-GGUF" in refused.value.error
    with pytest.raises(ollama.ResponseError, match="not found"):
        client.pull("llama3.2:1b")
    # Streamed, the status line has gone out: the error follows it as a line of its own.
    with pytest.raises(ollama.ResponseError, match="has no model repository"):
        list(client.pull("hf.co/org/Missing-GGUF", stream=True))


def test_rm_deletes_a_pulled_model_and_refuses_what_it_did_not_pull(
    base_url: str, tmp_path: Path
) -> None:
    client = ollama.Client(host=base_url, timeout=60)
    client.pull(REFERENCE)
    client.generate(PULLED, "Hello", options={"num_predict": 2})  # loaded: rm unloads it
    assert client.delete(f"{PULLED}:latest").status == "success"
    assert f"{PULLED}:latest" not in listed(client)
    assert not (tmp_path / "models" / "org" / "Tiny-GGUF" / "Tiny-Q8_0.gguf").exists()
    assert client.ps().models == []
    with pytest.raises(ollama.ResponseError) as again:
        client.delete(PULLED)
    assert again.value.status_code == 404
    # A model that came with a PyPI package is not the base_url's to delete.
    default = next(name for name in listed(client) if name.startswith("SmolLM2"))
    packaged = httpx.request("DELETE", f"{base_url}/api/delete", json={"model": default})
    assert packaged.status_code == 400
    assert "comes with a PyPI package" in packaged.json()["error"]
    missing = httpx.request("DELETE", f"{base_url}/api/delete", json={})
    assert missing.status_code == 400
