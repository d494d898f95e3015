"""Observability overhead: tokens/s with metrics and tracing (probability 1.0) on vs both off.

Two real `kronk server start` processes on the default model, side by side in one
run: "on" runs the debug server (scraped every round) and exports every request's
spans over OTLP/HTTP to a receiver in this process; "off" runs with the debug and
tempo plugins disabled. Rounds alternate between them (only one works at a time);
each round streams the same concurrent chats. Target: "on" at most 2% slower.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.server import free_port


@contextlib.contextmanager
def otlp_sink() -> Iterator[tuple[str, list[int]]]:
    """An OTLP/HTTP endpoint that accepts and drops exports (a collector's cost is not Kronk's)."""
    sizes: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            sizes.append(len(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", sizes
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def kronk_server(base: Path, environment: dict[str, str]) -> Iterator[str]:
    host = f"127.0.0.1:{free_port()}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    # No message caching: every round does the same prefill and decode work.
    models = base / "models.yaml"
    models.write_text(f"models:\n  {GEMMA_MODEL_ID}:\n    cache: none\n")
    env.update(environment, KRONK_API_HOST=host, KRONK_BASE_PATH=str(base), KRONK_PRELOAD="true")
    env.update(KRONK_LOG_LEVEL="warning", KRONK_MODEL_CONFIG_FILE=str(models))
    env.update(KRONK_MODEL=GEMMA_MODEL_ID)
    log = (base / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "kronk_api.cli", "server", "start"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"http://{host}/v1/readiness", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"server did not start; see {base / 'server.log'}")
            time.sleep(0.2)
        # Ready means accepting; the preload has finished once a chat answers.
        httpx.post(
            f"http://{host}/v1/chat/completions",
            json={"model": GEMMA_MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
            timeout=180,
        )
        yield f"http://{host}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


async def round_rate(base_url: str, streams: int, tokens: int) -> tuple[int, float]:
    """Generated tokens and wall seconds of `streams` concurrent streamed chats."""

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": GEMMA_MODEL_ID,
            "messages": [{"role": "user", "content": f"Count from {i + 1} to 1000, one a line."}],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        produced = 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"usage": {' in line:
                    produced = json.loads(line.removeprefix("data: "))["usage"]["completion_tokens"]
        return produced

    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        began = time.perf_counter()
        counts = await asyncio.gather(*(one(client, i) for i in range(streams)))
        return sum(counts), time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8, help="rounds per side")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, otlp_sink() as (sink, exports):
        on_base, off_base = Path(scratch, "on"), Path(scratch, "off")
        on_base.mkdir()
        off_base.mkdir()
        debug_host = f"127.0.0.1:{free_port()}"
        on_env = {
            "KRONK_DEBUG_HOST": debug_host,
            "KRONK_TEMPO_HOST": f"http://{sink}",
            "KRONK_TEMPO_PROTOCOL": "http",
            "KRONK_TEMPO_PROBABILITY": "1.0",
        }
        off_env = {"KRONK_DISABLE_PLUGINS": "debug,tempo"}
        with kronk_server(on_base, on_env) as on, kronk_server(off_base, off_env) as off:
            for url in (on, off):  # warm-up
                asyncio.run(round_rate(url, args.streams, 8))
            totals = {"on": [0, 0.0], "off": [0, 0.0]}
            for index in range(args.rounds * 2):
                # Alternate, and swap who goes first every other pair.
                side = ("on", "off")[(index + index // 2) % 2]
                url = on if side == "on" else off
                produced, seconds = asyncio.run(round_rate(url, args.streams, args.tokens))
                if side == "on":
                    scraped = httpx.get(f"http://{debug_host}/metrics", timeout=30)
                    assert scraped.status_code == 200
                totals[side][0] += produced
                totals[side][1] += seconds
                print(f"round {index + 1:>2} {side:<4}{produced / seconds:>10.1f} tok/s")
    rate = {side: produced / seconds for side, (produced, seconds) in totals.items()}
    print(f"\n{'observability':<34}{'tok/s':>10}")
    print(f"{'off (plugins disabled)':<34}{rate['off']:>10.1f}")
    print(f"{'on (metrics + traces at 1.0)':<34}{rate['on']:>10.1f}")
    print(f"{'OTLP exports received':<34}{len(exports):>10}")
    print(f"{'overhead':<34}{(1 - rate['on'] / rate['off']) * 100:>9.1f}%  (target <= 2%)")


if __name__ == "__main__":
    main()
