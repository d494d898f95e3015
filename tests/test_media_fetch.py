"""Fetched image URLs (media fetch_urls) against a real server and local HTTP servers: no
loopback or private address unless media fetch_allow_hosts names the host (on every
redirect hop), no fetch for a model that does not read images, one deadline for the whole
fetch, cancelled with the request, and one error text whatever went wrong."""

from __future__ import annotations

import ipaddress
import itertools
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, MediaConfig, ModelConfig
from kronk_core.media_fetch import HostPolicy, public
from kronk_testing.file_server import FileServer, Served
from kronk_testing.media_samples import image
from kronk_testing.plugin import MultimodalPaths
from kronk_testing.server import Serve, free_port

FETCH_TIMEOUT = 2.0
# A fetch cut at its deadline answers well within this much more (a loaded machine).
MARGIN = 10.0
PNG = image((30, 60, 90))


class DripServer:
    """An HTTP server on 127.0.0.1 that answers its first connection 200 with a PNG, one
    byte a second, for as long as the client keeps the connection open; `closed` is set
    when the client closes it."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connected = threading.Event()
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> DripServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._listener.close()

    def _serve(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except OSError:
            return
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                piece = connection.recv(4096)
                if not piece:
                    self.closed.set()
                    return
                request += piece
            self.connected.set()
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n"
                b"Content-Length: %d\r\n\r\n" % len(PNG)
            )
            for byte in itertools.cycle(PNG):
                readable, _, _ = select.select([connection], [], [], 1.0)
                try:
                    if readable and not connection.recv(1):
                        break
                    connection.sendall(bytes([byte]))
                except OSError:
                    break
            self.closed.set()


@dataclass
class Servers:
    url: str  # fetches within FETCH_TIMEOUT; allows "localhost" by name, not 127.0.0.1
    patient_url: str  # the same with a deadline no test reaches
    files: FileServer


def _kronk(base: Path, paths: MultimodalPaths, timeout: float) -> Kronk:
    def model(projector: Path | None) -> ModelConfig:
        return ModelConfig.model_validate(
            {
                "model_path": paths.model,
                "projector_path": projector,
                "templates": {"template": "gemma"},
                "context_window": 1024,
                "n_seq_max": 1,
                "cache": "none",
                "draft_strategy": "none",
            }
        )

    media = MediaConfig(fetch_urls=True, fetch_timeout=timeout, fetch_allow_hosts=["localhost"])
    models = {"mm": model(paths.vision), "text": model(None), "audio": model(paths.audio)}
    return Kronk(KronkConfig(base_path=base, media=media, models=models))


@pytest.fixture(scope="module")
def servers(
    multimodal_paths: MultimodalPaths, tmp_path_factory: pytest.TempPathFactory, serve: Serve
) -> Iterator[Servers]:
    base = tmp_path_factory.mktemp("kronk-media-fetch")
    kronk = _kronk(base, multimodal_paths, FETCH_TIMEOUT)
    patient = _kronk(base, multimodal_paths, 600.0)
    # Loaded now, so that a request's time is its fetch's.
    kronk.load("mm")
    patient.load("mm")
    with (
        FileServer() as files,
        serve(create_app(ServerSettings(), kronk=kronk)) as url,
        serve(create_app(ServerSettings(), kronk=patient)) as patient_url,
    ):
        files.routes["/cat.png"] = Served(data=PNG, headers={"Content-Type": "image/png"})
        yield Servers(url, patient_url, files)


def chat_body(image_url: str, model: str = "mm") -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 2,
        "temperature": 0,
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}}]}
        ],
    }


def ask(base_url: str, image_url: str, model: str = "mm") -> httpx.Response:
    return httpx.post(
        base_url + "/v1/chat/completions", json=chat_body(image_url, model), timeout=60
    )


def refusal(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    message: str = response.json()["error"]["message"]
    return message


def test_loopback_is_refused_unless_its_host_is_allowed(servers: Servers) -> None:
    port = servers.files.port
    refused = refusal(ask(servers.url, f"http://127.0.0.1:{port}/cat.png"))
    assert "127.0.0.1 has an address fetches may not reach" in refused
    assert "fetch_allow_hosts" in refused
    assert servers.files.gets("/cat.png") == []
    answered = ask(servers.url, f"http://localhost:{port}/cat.png")
    assert answered.status_code == 200, answered.text
    assert answered.json()["usage"]["prompt_tokens"] > 0
    assert len(servers.files.gets("/cat.png")) == 1


def test_a_redirect_from_an_allowed_host_to_loopback_is_refused(servers: Servers) -> None:
    port = servers.files.port
    servers.files.routes["/away.png"] = Served(redirect=f"http://127.0.0.1:{port}/hidden.png")
    servers.files.routes["/hidden.png"] = Served(data=PNG)
    refused = refusal(ask(servers.url, f"http://localhost:{port}/away.png"))
    assert "127.0.0.1 has an address fetches may not reach" in refused
    assert len(servers.files.gets("/away.png")) == 1
    assert servers.files.gets("/hidden.png") == []


@pytest.mark.parametrize(
    ("model", "says"), [("text", "has no projector"), ("audio", "reads audio input, not vision")]
)
def test_a_model_that_does_not_read_images_fetches_nothing(
    servers: Servers, model: str, says: str
) -> None:
    path = f"/for-{model}.png"
    servers.files.routes[path] = Served(data=PNG)
    refused = refusal(ask(servers.url, f"http://localhost:{servers.files.port}{path}", model))
    assert says in refused
    assert servers.files.gets(path) == []


def test_a_dripping_server_is_cut_at_the_one_deadline(servers: Servers) -> None:
    with DripServer() as drip:
        started = time.monotonic()
        refused = refusal(ask(servers.url, f"http://localhost:{drip.port}/slow.png"))
        elapsed = time.monotonic() - started
        assert drip.closed.wait(30), "the fetch's connection stayed open"
    assert FETCH_TIMEOUT * 0.9 <= elapsed < FETCH_TIMEOUT + MARGIN
    assert refused.startswith(f"could not fetch http://localhost:{drip.port}/slow.png")


def test_a_client_that_leaves_cancels_the_fetch(servers: Servers) -> None:
    with DripServer() as drip:
        body = json.dumps(chat_body(f"http://localhost:{drip.port}/slow.png")).encode()
        host, port = servers.patient_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: kronk\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                % (len(body), body)
            )
            assert drip.connected.wait(60), "the fetch never started"
        # The patient server's deadline is 600 s: only the cancellation closes it now.
        assert drip.closed.wait(30), "the fetch went on after its client left"


def test_every_failure_after_the_address_check_reads_the_same(servers: Servers) -> None:
    files = servers.files
    files.routes["/page.html"] = Served(
        data=b"<html></html>", headers={"Content-Type": "text/html"}
    )
    with DripServer() as drip:
        urls = [
            f"http://localhost:{free_port()}/closed.png",  # nothing listens
            f"http://localhost:{files.port}/missing.png",  # 404
            f"http://localhost:{files.port}/page.html",  # not an image
            f"http://localhost:{drip.port}/slow.png",  # past the deadline
            "http://no-such-host.invalid/cat.png",  # no DNS answer
        ]
        texts = {refusal(ask(servers.url, url)).replace(url, "URL") for url in urls}
    assert len(texts) == 1, texts
    assert texts.pop().startswith("could not fetch URL: ")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "0.0.0.0",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.100.100.200",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "fe80::1",
        "fd00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
    ],
)
def test_addresses_that_are_not_public_are_refused(address: str) -> None:
    assert not public(ipaddress.ip_address(address))
    assert not HostPolicy.of([]).allows("example.com", ipaddress.ip_address(address))


def test_the_operator_allows_hosts_by_name_address_or_network() -> None:
    policy = HostPolicy.of(
        MediaConfig(
            fetch_allow_hosts=["Images.Internal.", "127.0.0.1", "10.0.0.0/8"]
        ).fetch_allow_hosts
    )
    loopback, private = ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("192.168.1.9")
    assert policy.allows("images.internal", private)
    assert policy.allows("anything", loopback)
    assert policy.allows("anything", ipaddress.ip_address("::ffff:127.0.0.1"))
    assert policy.allows("anything", ipaddress.ip_address("10.20.30.40"))
    assert not policy.allows("anything", private)
    assert not policy.allows("anything", ipaddress.ip_address("127.0.0.2"))
    assert policy.allows("example.com", ipaddress.ip_address("93.184.215.14"))


def test_allow_hosts_are_checked_and_split() -> None:
    settings = ServerSettings.model_validate({"media_fetch_allow_hosts": "localhost, 10.0.0.0/8"})
    assert settings.kronk_config().media.fetch_allow_hosts == ["localhost", "10.0.0.0/8"]
    for wrong in ("http://images.internal", "images.internal:8080"):
        with pytest.raises(ValidationError, match="is not a host name, an IP address or a network"):
            ServerSettings.model_validate({"media_fetch_allow_hosts": [wrong]})
