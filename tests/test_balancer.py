"""Two Kronk servers behind HAProxy (deploy/haproxy.cfg) or nginx (deploy/nginx.conf), as
shipped, on loopback.

One auth service (its limit store on Redis) checks both replicas' tokens; the
replicas share one host_cache_dir. A conversation that sends X-Kronk-Session stays
on one replica and reuses its KV; when that replica is killed, the next turn goes to
the other, which restores the conversation from the shared directory and answers
what a cold run answers; the token's quota is one quota across both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID

if TYPE_CHECKING:
    from kronk_testing.server import Serve

ROOT = Path(__file__).resolve().parent.parent
HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
BALANCERS = [
    pytest.param(
        "haproxy",
        marks=pytest.mark.skipif(
            HAPROXY is None, reason="haproxy is not installed (nox -s full installs Debian's)"
        ),
    ),
    pytest.param(
        "nginx",
        marks=pytest.mark.skipif(
            NGINX is None, reason="nginx is not installed (nox -s full installs Debian's)"
        ),
    ),
]
# nginx's main context around the shipped http-context file, with every path in the
# test's folder (Debian's nginx.conf has the same shape: logs, temp files, an include).
NGINX_MAIN = """worker_processes 1;
error_log {root}/error.log;
pid {root}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    include {config};
}}
"""

CHAT = "/v1/chat/completions"
# Longer than cache_min_tokens (100), so the conversation is worth storing and restoring.
SYSTEM = (
    "You are a terse assistant for a hardware store. Answer in one short sentence. "
    "The store sells hammers, screwdrivers, wrenches, pliers, saws, drills, nails, "
    "screws, bolts, nuts, washers, glue, tape, paint, brushes, rollers, ladders, "
    "buckets, gloves, goggles, masks, measuring tapes, levels, clamps and files. "
    "It opens at eight in the morning and closes at six in the evening, every day "
    "except Sunday. Returns are accepted within thirty days with a receipt."
)
QUESTIONS = ["What do you sell for painting?", "When do you open?", "Can I return a saw?"]


@dataclass
class Replica:
    url: str
    host: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class Cluster:
    service: str
    admin: str
    balancer: str
    replicas: dict[str, Replica]  # by api_host, as X-Kronk-Replica names them
    shared_dir: Path


def _wait(check: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return None


def _start_replica(base: Path, models_file: Path, service_host: str, port: int) -> Replica:
    host = f"127.0.0.1:{port}"
    base.mkdir(parents=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    env.update(
        KRONK_API_HOST=host,
        KRONK_BASE_PATH=str(base),
        KRONK_MODEL_CONFIG_FILE=str(models_file),
        KRONK_PRELOAD="true",
        KRONK_AUTH_JWT_ENABLED="true",
        KRONK_AUTH_JWT_HOST=service_host,
    )
    log = base / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kronk_api.cli", "server", "start"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return Replica(f"http://{host}", host, process, log)


def _shipped(name: str, listen: str, replicas: list[Replica]) -> str:
    config = (ROOT / "deploy" / name).read_text(encoding="utf-8")
    for placeholder, value in (
        ("LISTEN", listen),
        ("REPLICA_A", replicas[0].host),
        ("REPLICA_B", replicas[1].host),
    ):
        config = config.replace("{{" + placeholder + "}}", value)
    return config


def _start_balancer(
    kind: str, root: Path, listen: str, replicas: list[Replica]
) -> subprocess.Popen[bytes]:
    """HAProxy or nginx in the foreground, with the shipped configuration."""
    folder = root / kind
    folder.mkdir()
    if kind == "haproxy":
        config_file = folder / "haproxy.cfg"
        config_file.write_text(_shipped("haproxy.cfg", listen, replicas), encoding="utf-8")
        assert HAPROXY is not None
        command = [HAPROXY, "-db", "-f", str(config_file)]
    else:
        shipped = folder / "kronk.conf"
        shipped.write_text(_shipped("nginx.conf", listen, replicas), encoding="utf-8")
        main = folder / "nginx.conf"
        main.write_text(NGINX_MAIN.format(root=folder, config=shipped), encoding="utf-8")
        assert NGINX is not None
        command = [NGINX, "-p", str(folder), "-e", str(folder / "error.log"), "-c", str(main)]
        command += ["-g", "daemon off;"]
    with (folder / "output.log").open("wb") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module", params=BALANCERS)
def cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    serve: Serve,
    redis_url: str,
    port_finder: Callable[[], int],
) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    shared = root / "host-cache"
    models_file = root / "models.yaml"
    models_file.write_text(
        f"models:\n  {DEFAULT_MODEL_ID}:\n    context_window: 2048\n    n_seq_max: 2\n"
        f"    cache: imc\n    caching:\n      host_cache_dir: {shared}\n"
        "      host_cache_shared: true\n",
        encoding="utf-8",
    )
    # The auth service, with the one set of counters on Redis. It also runs the reference:
    # the same conversation, never interrupted, on the replicas' KV layout.
    service_base = root / "service"
    same = ModelConfig(context_window=2048, n_seq_max=2, cache="imc")
    kronk = Kronk(KronkConfig(base_path=service_base, models={DEFAULT_MODEL_ID: same}))
    settings = ServerSettings(
        base_path=service_base,
        sections={"auth-jwt": {"enabled": True, "limit_store": redis_url}},
    )
    with serve(create_app(settings, kronk=kronk)) as service:
        service_host = service.removeprefix("http://")
        replicas = [
            _start_replica(root / name, models_file, service_host, port_finder())
            for name in ("r1", "r2")
        ]
        balancer_process = None
        try:
            for replica in replicas:
                _wait(lambda r=replica: _status(r.url + "/v1/readiness") == 200, r"readiness")
            listen = f"127.0.0.1:{port_finder()}"
            balancer_process = _start_balancer(request.param, root, listen, replicas)
            balancer = f"http://{listen}"
            _wait(lambda: _status(balancer + "/v1/readiness") == 200, request.param)
            # Both replicas in rotation (HAProxy: they passed `rise 2` health checks): a
            # request without X-Kronk-Session goes round-robin, so both answer in turn.
            seen: set[str] = set()

            def both_answer() -> bool:
                answer = httpx.get(balancer + "/v1/readiness", timeout=5)
                seen.add(answer.headers.get("x-kronk-replica", ""))
                return {r.host for r in replicas} <= seen

            _wait(both_answer, "both replicas in rotation")
            admin = (service_base / "keys" / "master.jwt").read_text()
            yield Cluster(service, admin, balancer, {r.host: r for r in replicas}, shared)
        finally:
            if balancer_process is not None:
                balancer_process.terminate()
                balancer_process.wait(timeout=10)
            for replica in replicas:
                if replica.process.poll() is None:
                    replica.process.kill()
                replica.process.wait(timeout=30)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _chat(url: str, messages: list[dict[str, str]], headers: dict[str, str]) -> httpx.Response:
    body = {"model": DEFAULT_MODEL_ID, "messages": messages, "temperature": 0, "max_tokens": 24}
    return httpx.post(url + CHAT, json=body, headers=headers, timeout=120)


def _idle(replica: Replica, admin: str) -> bool:
    """Every slot released (the last request's state is written by then)."""
    answer = httpx.get(f"{replica.url}/v1/kronk/slots", headers=_bearer(admin), timeout=10)
    models = answer.json()["data"] if answer.status_code == 200 else []
    return all(not slot["busy"] for model in models for slot in model["slots"])


def test_a_conversation_sticks_to_a_replica_and_survives_its_death(cluster: Cluster) -> None:
    minted = httpx.post(
        f"{cluster.service}/v1/kronk/security/tokens",
        json={"duration": "1h", "endpoints": "chat-completions:4/day"},
        headers=_bearer(cluster.admin),
    )
    assert minted.status_code == 201, minted.text
    headers = {**_bearer(minted.json()["token"]), "X-Kronk-Session": "conversation-1"}
    messages = [{"role": "system", "content": SYSTEM}]
    served: list[str] = []
    for turn, question in enumerate(QUESTIONS[:2]):
        messages.append({"role": "user", "content": question})
        answer = _chat(cluster.balancer, messages, headers)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-kronk-session"] == "conversation-1"
        served.append(answer.headers["x-kronk-replica"])
        cached = answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert (cached > 0) == (turn > 0), answer.json()["usage"]
        reply = answer.json()["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})
    assert served[0] == served[1]  # both turns on one replica
    first = cluster.replicas[served[0]]
    (other,) = (r for host, r in cluster.replicas.items() if host != served[0])

    # The conversation is on the shared disk once the replica released its slot.
    _wait(lambda: _idle(first, cluster.admin), "the slot's release")
    assert list(cluster.shared_dir.rglob("*.tokens"))
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=30)
    # The balancer sends the conversation to the survivor (HAProxy once a health check
    # marked the dead one down, or at once by redispatching a refused connection; nginx when
    # the next request's connection is refused): seen on readiness probes that carry the
    # session, which count against no quota.
    def routed_to_the_survivor() -> bool:
        probe = httpx.get(
            cluster.balancer + "/v1/readiness",
            headers={"X-Kronk-Session": "conversation-1"},
            timeout=5,
        )
        return probe.headers.get("x-kronk-replica") == other.host

    _wait(routed_to_the_survivor, "the conversation's next request going to the survivor")

    messages.append({"role": "user", "content": QUESTIONS[2]})
    answer = _chat(cluster.balancer, messages, headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-kronk-replica"] == other.host
    usage = answer.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0, (usage, other.log.read_text())
    # The same greedy tokens as the conversation run without a failover, turn by turn (so
    # its KV is decoded in the same chunks: llama.cpp's CPU kernels round differently for
    # other batch layouts, and a one-chunk cold run of the whole prompt can drift from both).
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    replies.append(answer.json()["choices"][0]["message"]["content"])
    for turn in range(3):
        upto = [m for m in messages if m["role"] != "assistant"][: turn + 2]
        shown = [upto[0]]
        for index, question in enumerate(upto[1:]):
            shown.append(question)
            if index < turn:
                shown.append({"role": "assistant", "content": replies[index]})
        reference = _chat(cluster.service, shown, _bearer(cluster.admin))
        assert reference.status_code == 200, reference.text
        assert reference.json()["choices"][0]["message"]["content"] == replies[turn], turn

    # 4 a day across both replicas: 3 used, one left, then a 429 from the survivor.
    assert _chat(cluster.balancer, messages, headers).status_code == 200
    refused = _chat(cluster.balancer, messages, headers)
    assert refused.status_code == 429, refused.text
    assert refused.headers["x-kronk-replica"] == other.host
