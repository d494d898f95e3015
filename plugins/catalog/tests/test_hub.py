"""Models by the names users already use (`org/repo`, `org/repo:Q4_K_M`, `hf.co/...`), resolved
by the real huggingface_hub client against a local Hub (kronk_testing.hub_server) given through
HF_ENDPOINT, fetched by Kronk's downloader, then loaded and asked by real llama.cpp."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from click.testing import CliRunner
from openai import NotFoundError, OpenAI

from kronk_api import ServerSettings, create_app
from kronk_api.cli import main
from kronk_catalog.references import (
    RepoReference,
    names_quant,
    parse_reference,
    pick_model,
    pick_projector,
)
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import ModelNotFoundError
from kronk_testing.hub_server import Hub, HubRepo

if TYPE_CHECKING:
    from kronk_testing.plugin import MultimodalPaths
    from kronk_testing.server import Serve

HUB_PATHS = ("/api/models/", "/org/")


def hub_requests(hub: Hub) -> list[tuple[str, str | None]]:
    """What the Hub was asked (API and file routes), with the Authorization sent."""
    return [
        (request.path, request.headers.get("authorization"))
        for request in hub.requests
        if request.path.startswith(HUB_PATHS)
    ]


def pulled(base: Path) -> list[str]:
    """Files under <base>/models (partial downloads and lock files too)."""
    root = base / "models"
    if not root.is_dir():
        return []
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def kronk_command(base: Path, hub: Hub, *arguments: str, **env: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, list(arguments), env={"HF_ENDPOINT": hub.url, "KRONK_BASE_PATH": str(base), **env}
    )
    return result.exit_code, result.output


def pull_process(
    base: Path, hub: Hub, reference: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`kronk model pull` as its own process, whose huggingface_hub reads its token from
    HF_TOKEN or HF_HOME (where `hf auth login` saves it) as it starts."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KRONK_"))}
    environment.update(
        HF_ENDPOINT=hub.url, HF_HOME=str(base / "hf"), KRONK_BASE_PATH=str(base), **env
    )
    return subprocess.run(
        [sys.executable, "-m", "kronk_api.cli", "model", "pull", reference],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def answer(base: Path, model: str, **config: object) -> str:
    """A chat with `model` (an id or a reference) on a Kronk over `base`; the id that answered."""

    async def chat() -> str:
        with Kronk(KronkConfig(base_path=base, **config)) as kronk:  # type: ignore[arg-type]
            stream = await kronk.start_chat(
                kronk.chat_request([{"role": "user", "content": "hi"}], model=model, max_tokens=3)
            )
            async for delta in stream:
                if delta.usage is not None:
                    assert delta.usage.completion_tokens >= 1
            return stream.model_id

    return asyncio.run(chat())


@pytest.fixture
def tiny_repo(multimodal_paths: MultimodalPaths) -> HubRepo:
    """A repository as people publish GGUF models: several quantizations, projectors, a card.
    Every model file is the tiny multimodal test model, every projector its vision projector:
    a pulled model loads with the projector pulled beside it."""
    model, projector = multimodal_paths.model, multimodal_paths.vision
    return HubRepo(
        {
            "README.md": b"# Tiny\n",
            ".gitattributes": b"*.gguf filter=lfs\n",
            "Tiny-Q8_0.gguf": model,
            "Tiny-Q4_K_M.gguf": model,
            "Tiny-UD-Q4_K_M.gguf": model,
            "mmproj-Tiny-F32.gguf": projector,
            "mmproj-Tiny-F16.gguf": projector,
        }
    )


@pytest.fixture
def hub(tiny_repo: HubRepo) -> Iterator[Hub]:
    with Hub(token="hf_granted") as running:
        running.repos["org/Tiny-GGUF"] = tiny_repo
        yield running


# ---- picking files as llama-server's -hf does ------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("org/repo", RepoReference("org/repo")),
        ("org/repo:Q4_K_M", RepoReference("org/repo", "Q4_K_M")),
        ("org/repo:latest", RepoReference("org/repo")),
        ("hf.co/org/repo:q8_0", RepoReference("org/repo", "q8_0")),
        ("huggingface.co/org/repo", RepoReference("org/repo")),
        ("https://huggingface.co/org/repo", RepoReference("org/repo")),
        ("http://mirror.local:8000/org/repo", RepoReference("org/repo")),
        ("org/repo/file.gguf", None),
        ("https://huggingface.co/org/repo/resolve/main/file.gguf", None),
        ("https://example.com/org/repo", None),
        ("gemma-3-270m-Q4_K_M", None),
    ],
)
def test_references_name_a_repository_or_not(text: str, expected: RepoReference | None) -> None:
    assert parse_reference(text, "http://mirror.local:8000") == expected


@pytest.mark.parametrize(
    ("path", "quant", "named"),
    [
        ("m-Q4_K_M.gguf", "Q4_K_M", True),
        ("m.q4_k_m.gguf", "Q4_K_M", True),
        ("Q4_K_M/m-00001-of-00002.gguf", "q4_k_m", True),
        ("m-Q4_K_M-00001-of-00002.gguf", "Q4_K_M", True),
        ("m-UD-Q4_K_XL.gguf", "Q4_K_XL", True),
        ("m-Q4_K_M.gguf", "Q4_K", False),
        ("m-IQ4_XS.gguf", "Q4_XS", False),
        ("m-Q8_0.gguf", "Q4_K_M", False),
    ],
)
def test_a_quantization_is_a_word_of_the_file_name(path: str, quant: str, named: bool) -> None:
    assert names_quant(path, quant) is named


def test_the_files_of_a_reference_are_picked_as_llama_server_picks_them() -> None:
    paths = [
        "README.md",
        "m-Q8_0.gguf",
        "m-UD-Q4_K_M.gguf",
        "m-Q4_K_M.gguf",
        "BF16/m-BF16-00002-of-00002.gguf",
        "BF16/m-BF16-00001-of-00002.gguf",
        "mmproj-m-F32.gguf",
        "mmproj-m-F16.gguf",
        "BF16/mmproj-m-BF16.gguf",
    ]
    repo = "org/m-GGUF"
    assert pick_model(RepoReference(repo), paths) == ["m-Q4_K_M.gguf"]
    assert pick_model(RepoReference(repo, "q8_0"), paths) == ["m-Q8_0.gguf"]
    assert pick_model(RepoReference(repo, "BF16"), paths) == [
        "BF16/m-BF16-00001-of-00002.gguf",
        "BF16/m-BF16-00002-of-00002.gguf",
    ]
    # Without Q4_K_M, the first model file.
    assert pick_model(RepoReference(repo), ["m-Q8_0.gguf", "m-Q2_K.gguf"]) == ["m-Q2_K.gguf"]
    # The projector beside the model: its own precision, else the least lossy.
    assert pick_projector("m-Q4_K_M.gguf", paths) == "mmproj-m-F16.gguf"
    assert pick_projector("BF16/m-BF16-00001-of-00002.gguf", paths) == "BF16/mmproj-m-BF16.gguf"
    assert pick_projector("m-Q4_K_M.gguf", ["m-Q4_K_M.gguf"]) is None
    with pytest.raises(ModelNotFoundError, match=r"no Q2_K GGUF file \(its GGUF models: .*m-Q8_0"):
        pick_model(RepoReference(repo, "Q2_K"), paths)
    with pytest.raises(ModelNotFoundError, match=r"m-BF16-00002-of-00002\.gguf is missing"):
        pick_model(RepoReference(repo, "BF16"), ["BF16/m-BF16-00001-of-00002.gguf"])


# ---- pulls from the Hub -----------------------------------------------------------------


def test_a_repository_gives_its_default_quantization_and_its_projector(
    tmp_path: Path, hub: Hub
) -> None:
    code, output = kronk_command(tmp_path, hub, "model", "pull", "org/Tiny-GGUF")
    assert code == 0, output
    assert "pulled Tiny-Q4_K_M" in output
    assert pulled(tmp_path) == [
        "org/Tiny-GGUF/Tiny-Q4_K_M.gguf",
        "org/Tiny-GGUF/mmproj-Tiny-F16.gguf",
    ]
    commit = hub.repos["org/Tiny-GGUF"].commit
    assert [path for path, _ in hub_requests(hub)] == [
        "/api/models/org/Tiny-GGUF",
        f"/org/Tiny-GGUF/resolve/{commit}/Tiny-Q4_K_M.gguf",
        f"/org/Tiny-GGUF/resolve/{commit}/mmproj-Tiny-F16.gguf",
    ]
    assert len(hub.cdn.requests) == 2
    # Once pulled, the reference names the model, with no Hub to ask.
    hub.__exit__(None, None, None)
    assert answer(tmp_path, "Tiny-Q4_K_M") == "Tiny-Q4_K_M"
    assert answer(tmp_path, "hf.co/org/Tiny-GGUF") == "Tiny-Q4_K_M"


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("org/Tiny-GGUF:q8_0", "Tiny-Q8_0.gguf"),
        ("hf.co/org/Tiny-GGUF:Q8_0", "Tiny-Q8_0.gguf"),
        ("huggingface.co/org/Tiny-GGUF:UD-Q4_K_M", "Tiny-UD-Q4_K_M.gguf"),
        ("org/Tiny-GGUF:latest", "Tiny-Q4_K_M.gguf"),
        ("https://huggingface.co/org/Tiny-GGUF", "Tiny-Q4_K_M.gguf"),
    ],
)
def test_a_quantization_named_in_any_spelling(
    tmp_path: Path, hub: Hub, reference: str, expected: str
) -> None:
    code, output = kronk_command(tmp_path, hub, "model", "pull", reference)
    assert code == 0, output
    assert pulled(tmp_path) == [f"org/Tiny-GGUF/{expected}", "org/Tiny-GGUF/mmproj-Tiny-F16.gguf"]


def test_a_split_quantization_comes_in_all_its_parts_and_answers(
    tmp_path: Path, hub: Hub, tiny_split_paths: list[Path], tiny_llama_path: Path
) -> None:
    first, second = tiny_split_paths
    hub.repos["org/Split-GGUF"] = HubRepo(
        {
            "Split-Q8_0.gguf": tiny_llama_path,
            "Q4_K_M/Split-Q4_K_M-00001-of-00002.gguf": first,
            "Q4_K_M/Split-Q4_K_M-00002-of-00002.gguf": second,
        }
    )
    code, output = kronk_command(tmp_path, hub, "model", "pull", "org/Split-GGUF:Q4_K_M")
    assert code == 0, output
    assert pulled(tmp_path) == [
        "org/Split-GGUF/Q4_K_M/Split-Q4_K_M-00001-of-00002.gguf",
        "org/Split-GGUF/Q4_K_M/Split-Q4_K_M-00002-of-00002.gguf",
    ]
    assert answer(tmp_path, "org/Split-GGUF:Q4_K_M") == "Split-Q4_K_M"


@pytest.mark.parametrize(
    ("reference", "words"),
    [
        ("org/Tiny-GGUF:Q2_K", "org/Tiny-GGUF has no Q2_K GGUF file (its GGUF models: Tiny-Q4_K_M"),
        (
            "org/Nothing-GGUF",
            "has no model repository org/Nothing-GGUF; a private one needs a "
            "token: set HF_TOKEN or run `hf auth login`",
        ),
        ("org/Card-only", "org/Card-only has no GGUF model file (its GGUF models: none)"),
        ("org/Broken-GGUF:Q4_K_M", "is split in 2 parts, but"),
    ],
)
def test_what_a_repository_lacks_is_said_and_nothing_is_written(
    tmp_path: Path, hub: Hub, tiny_llama_path: Path, reference: str, words: str
) -> None:
    hub.repos["org/Card-only"] = HubRepo({"README.md": b"# nothing here\n"})
    hub.repos["org/Broken-GGUF"] = HubRepo({"B-Q4_K_M-00001-of-00002.gguf": tiny_llama_path})
    code, output = kronk_command(tmp_path, hub, "model", "pull", reference)
    assert code == 1 and words in " ".join(output.split()), output
    assert pulled(tmp_path) == []


def test_the_sha256_the_hub_lists_is_checked(
    tmp_path: Path, hub: Hub, tiny_llama_path: Path
) -> None:
    hub.repos["org/Tiny-GGUF"].sent_instead["Tiny-Q8_0.gguf"] = (
        tiny_llama_path.read_bytes()[:-1] + b"!"
    )
    code, output = kronk_command(tmp_path, hub, "model", "pull", "org/Tiny-GGUF:Q8_0")
    assert code == 1 and "the download was discarded" in output, output
    assert pulled(tmp_path) == []


def test_a_gated_repository_wants_a_token_and_gets_the_saved_one(
    tmp_path: Path, hub: Hub, tiny_llama_path: Path
) -> None:
    """Without a token: what to do, before anything is fetched. A token the Hub refuses
    (403): the same. The token `hf auth login` saved (HF_HOME/token) goes to the Hub's
    API and file routes, never to the CDN."""
    hub.repos["org/Gated-GGUF"] = HubRepo({"Gated-Q4_K_M.gguf": tiny_llama_path}, gated=True)
    refused = pull_process(tmp_path, hub, "org/Gated-GGUF")
    assert refused.returncode == 1
    assert (
        f"{hub.url}/org/Gated-GGUF is gated: accept its terms there, then set HF_TOKEN or run "
        "`hf auth login`"
    ) in refused.stderr
    assert not any("/resolve/" in path for path, _ in hub_requests(hub))

    wrong = pull_process(tmp_path, hub, "org/Gated-GGUF", HF_TOKEN="hf_other")
    assert wrong.returncode == 1
    assert "(403: Access to model org/Gated-GGUF is restricted and you are not in the " in (
        wrong.stderr
    )
    assert f"accept the model's terms on {hub.url}/org/Gated-GGUF with the account" in wrong.stderr
    assert pulled(tmp_path) == []

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("hf_granted\n")
    hub.requests.clear()
    granted = pull_process(tmp_path, hub, "org/Gated-GGUF")
    assert granted.returncode == 0, granted.stderr
    assert pulled(tmp_path) == ["org/Gated-GGUF/Gated-Q4_K_M.gguf"]
    assert {auth for _, auth in hub_requests(hub)} == {"Bearer hf_granted"}
    assert hub.cdn.requests
    assert all("authorization" not in request.headers for request in hub.cdn.requests)


def test_a_private_repository_is_listed_with_hf_token(
    tmp_path: Path, hub: Hub, tiny_llama_path: Path
) -> None:
    hub.repos["org/Private-GGUF"] = HubRepo({"P-Q4_K_M.gguf": tiny_llama_path}, private=True)
    hidden = pull_process(tmp_path, hub, "org/Private-GGUF")
    assert hidden.returncode == 1
    assert "has no model repository org/Private-GGUF; a private one needs a token" in (
        hidden.stderr
    )
    shown = pull_process(tmp_path, hub, "org/Private-GGUF", HF_TOKEN="hf_granted")
    assert shown.returncode == 0, shown.stderr
    assert pulled(tmp_path) == ["org/Private-GGUF/P-Q4_K_M.gguf"]


# ---- the same names wherever a model is named ---------------------------------------------


def test_kronk_run_pulls_a_reference_then_chats(tmp_path: Path, hub: Hub) -> None:
    result = CliRunner().invoke(
        main,
        ["run", "org/Tiny-GGUF:Q8_0", "--max-tokens", "3"],
        input="hi\n",
        env={"HF_ENDPOINT": hub.url, "KRONK_BASE_PATH": str(tmp_path)},
    )
    assert result.exit_code == 0, result.output
    assert "pulling org/Tiny-GGUF:Q8_0 (Tiny-Q8_0): 2 files" in result.output
    assert "pulled org/Tiny-GGUF:Q8_0 as Tiny-Q8_0" in result.output
    assert result.output.rstrip().splitlines()[-1].strip()  # the answer to the piped message
    assert pulled(tmp_path) == [
        "org/Tiny-GGUF/Tiny-Q8_0.gguf",
        "org/Tiny-GGUF/mmproj-Tiny-F16.gguf",
    ]


def chat(client: OpenAI, model: str) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.usage is not None and reply.usage.completion_tokens >= 1
    return reply.model


@pytest.mark.model
def test_a_server_with_auto_pull_pulls_what_a_request_names(
    tmp_path: Path, hub: Hub, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    app = create_app(ServerSettings(base_path=tmp_path, auto_pull=True))
    with serve(app) as base_url:
        client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        assert chat(client, "hf.co/org/Tiny-GGUF:Q8_0") == "Tiny-Q8_0"
        listed = {model.id for model in client.models.list()}
        assert "Tiny-Q8_0" in listed
        with pytest.raises(NotFoundError, match="has no model repository org/Missing-GGUF"):
            chat(client, "org/Missing-GGUF")
    assert pulled(tmp_path) == [
        "org/Tiny-GGUF/Tiny-Q8_0.gguf",
        "org/Tiny-GGUF/mmproj-Tiny-F16.gguf",
    ]


def test_without_auto_pull_a_request_pulls_nothing(
    tmp_path: Path, hub: Hub, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with serve(create_app(ServerSettings(base_path=tmp_path))) as base_url:
        client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(NotFoundError, match="model 'org/Tiny-GGUF:Q8_0' not found"):
            chat(client, "org/Tiny-GGUF:Q8_0")
        assert hub_requests(hub) == []
        # The server's pull route (the UI's form) takes the same names.
        started = httpx.post(f"{base_url}/v1/kronk/pulls", json={"url": "org/Tiny-GGUF:Q8_0"})
        assert started.status_code == 202, started.text
        assert started.json()["model"] == "Tiny-Q8_0"
        deadline = time.monotonic() + 60
        while httpx.get(f"{base_url}/v1/kronk/pulls").json()["data"][0]["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert chat(client, "org/Tiny-GGUF:Q8_0") == "Tiny-Q8_0"


@pytest.mark.model
def test_the_default_model_and_model_config_entries_are_pulled_by_reference(
    tmp_path: Path, hub: Hub, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model REF --preload` pulls and loads at start; an entry's `source` is pulled when
    the entry is first asked for, and its aliases answer for it."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n"
        "  agent:\n"
        "    source: org/Tiny-GGUF:Q8_0\n"
        "    n_seq_max: 1\n"
        "    aliases: [claude-sonnet-4-5, gpt-4o]\n"
    )
    settings = ServerSettings(
        base_path=tmp_path, model="org/Tiny-GGUF", preload=True, model_config_file=models
    )
    with serve(create_app(settings)) as base_url:
        ready = httpx.get(f"{base_url}/v1/readiness").json()
        assert (ready["model"], ready["model_state"]) == ("Tiny-Q4_K_M", "loaded")
        assert pulled(tmp_path)[0] == "org/Tiny-GGUF/Tiny-Q4_K_M.gguf"
        client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        cards = {card["id"]: card for card in httpx.get(f"{base_url}/v1/models").json()["data"]}
        assert cards["agent"]["context_length"] is None  # not pulled yet
        assert cards["gpt-4o"]["alias_of"] == "agent"
        assert chat(client, "claude-sonnet-4-5") == "agent"
        assert chat(client, "agent") == "agent"
        cards = {card["id"]: card for card in httpx.get(f"{base_url}/v1/models").json()["data"]}
        assert cards["agent"]["loaded"] and cards["agent"]["context_length"] == 8192
    assert pulled(tmp_path) == [
        "org/Tiny-GGUF/Tiny-Q4_K_M.gguf",
        "org/Tiny-GGUF/Tiny-Q8_0.gguf",
        "org/Tiny-GGUF/mmproj-Tiny-F16.gguf",
    ]
