"""Refresh the captured first requests of the coding agents' clients (tests/data/agents).

Each client pinned in kronk_testing/agents.py (CLIENTS, the one place their versions are
named) is installed with npm (once, into the user's cache), configured as docs/clients.md
says, asked to "Say hello." in an empty project against a local server that records what it
receives, and its first request that offers tools is written, scrubbed of what changes from
run to run, to tests/data/agents/<client>-<version>.json as {method, path, headers, body}.
A new release of a client is then one version bump away from being checked: bump its version
in kronk_testing/agents.py, run this, and run tests/test_agent_clients.py and
tests/test_agent_dialects.py.

Usage: python scripts/capture_agent_requests.py [--out DIR] [CLIENT ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from kronk_testing.agents import CLIENTS, capture_first_request, install_clients

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "agents"


def main() -> None:
    names = [client.name for client in CLIENTS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clients", nargs="*", metavar="CLIENT", help=f"{', '.join(names)}")
    parser.add_argument("--out", type=Path, default=DATA, help=f"where to write (default {DATA})")
    options = parser.parse_args()
    unknown = set(options.clients) - set(names)
    if unknown:
        parser.error(f"no client {', '.join(sorted(unknown))}; the clients: {', '.join(names)}")
    commands = install_clients()
    options.out.mkdir(parents=True, exist_ok=True)
    for client in CLIENTS:
        if options.clients and client.name not in options.clients:
            continue
        with tempfile.TemporaryDirectory(prefix=f"capture-{client.name}-") as work:
            request = capture_first_request(client, commands, Path(work))
        path = options.out / client.capture_file
        path.write_text(json.dumps(request, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{client.name} {client.version}: {request['method']} {request['path']} -> {path}")


if __name__ == "__main__":
    main()
