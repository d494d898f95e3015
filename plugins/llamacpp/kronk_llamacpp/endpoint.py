"""HOST:PORT of a llama.cpp RPC worker, as `rpc_servers` and `kronk rpc start --listen` write it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def parse(cls, value: str) -> Endpoint:
        """ValueError unless HOST:PORT with an IPv4 address or a name (ggml's RPC is IPv4)."""
        host, _, port = value.strip().rpartition(":")
        if not host or ":" in host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT (an IPv4 address or a name), got {value!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"
