"""Fetching a request's http(s) image URLs (media fetch_urls) without opening the server's
network to its clients.

A URL names whatever host the client likes, so a server that fetches it could be made to
reach what only the server can: its own ports (the debug port's /metrics), the LAN, a
cloud's metadata address. Hence:

- Every connection goes to an address that was resolved once and checked just before
  (`HostPolicy`), on every redirect hop (followed here, at most MAX_REDIRECTS): the check
  and the connection use the same address, so a second DNS answer cannot move it (DNS
  rebinding). Loopback, private, link-local and other non-public addresses are refused
  unless media fetch_allow_hosts names the host.
- One deadline, media fetch_timeout, covers the whole fetch: every URL of the request,
  every hop, connection and read. The fetch runs in the caller's task: cancelling it (the
  client left) closes its connections.
- Whatever goes wrong after the address check (refused connection, closed port, DNS
  failure, timeout, an answer that is not an image) gives the client the same text, so it
  cannot map ports; the log has the reason at debug level.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpcore  # with httpx, a dependency of the server (litestar); the SDK never fetches
import httpx

from kronk_core.contract.errors import MediaError
from kronk_core.contract.media import Media, MediaConfig, is_remote

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# What a fetch says it wants, and who asks.
_HEADERS = [(b"Accept", b"image/*, audio/*"), (b"User-Agent", b"kronk")]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def public(address: Address) -> bool:
    """Whether a client may make the server connect to `address`: not loopback, link-local,
    private, multicast, reserved, unspecified, nor otherwise outside the global internet
    (100.64.0.0/10, where some clouds answer metadata requests). An IPv4-mapped IPv6
    address (::ffff:127.0.0.1) is judged as the IPv4 address it reaches."""
    address = _unmapped(address)
    return not (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


def _unmapped(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Where a fetch may connect: public addresses, and the hosts media fetch_allow_hosts
    names (a name as the URL spells it, an address, or a network such as 10.0.0.0/8)."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, hosts: Iterable[str]) -> HostPolicy:
        names: set[str] = set()
        networks: list[Network] = []
        for host in hosts:
            try:
                networks.append(ipaddress.ip_network(host, strict=False))
            except ValueError:
                names.add(host.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        if host.lower().rstrip(".") in self.names or public(address):
            return True
        address = _unmapped(address)
        return any(
            address.version == network.version and address in network for network in self.networks
        )


class _NotAllowed(Exception):
    """A host resolved to an address the policy refuses (raised before any connection)."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.host = host


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Connects only where the policy allows: resolves the host once, checks every address
    it has (one internal address refuses the host: a name that mixes them is a trap), then
    connects to those addresses themselves, never to the name again. TLS still checks the
    certificate against the name, which httpcore gives as the server name (SNI)."""

    def __init__(self, policy: HostPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in found))
        if not all(self._policy.allows(host, address) for address in addresses):
            raise _NotAllowed(host)
        failure: Exception = httpcore.ConnectError(f"{host} has no address")
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Unfetchable(Exception):
    """What went wrong, for the log; the client gets `could_not_fetch`'s text."""


async def fetch_urls(urls: Sequence[str], limits: MediaConfig) -> dict[str, Media]:
    """The http(s) URLs among `urls`, fetched, by URL; all within media fetch_timeout
    together, each within max_bytes. Nothing is fetched unless fetch_urls is on
    (MediaSources then says so)."""
    remote = list(dict.fromkeys(url for url in urls if is_remote(url)))
    if not remote or not limits.fetch_urls:
        return {}
    backend = _CheckedBackend(HostPolicy.of(limits.fetch_allow_hosts))
    fetched: dict[str, Media] = {}
    url = remote[0]
    try:
        # The pool inside the deadline: when it passes, leaving the pool closes every
        # connection before the TimeoutError comes out.
        async with (
            asyncio.timeout(limits.fetch_timeout),
            httpcore.AsyncConnectionPool(network_backend=backend) as pool,
        ):
            for url in remote:
                fetched[url] = await _fetch(pool, url, limits)
    except TimeoutError:
        log.debug("could not fetch %s: past media fetch_timeout", url)
        raise could_not_fetch(url, limits) from None
    return fetched


async def _fetch(pool: httpcore.AsyncConnectionPool, url: str, limits: MediaConfig) -> Media:
    target = url
    try:
        for _ in range(MAX_REDIRECTS + 1):
            parsed = httpx.URL(target)
            if parsed.scheme not in ("http", "https") or not parsed.raw_host:
                raise _Unfetchable(f"{target} is not an http(s) URL")
            request = httpcore.URL(
                scheme=parsed.raw_scheme,
                host=parsed.raw_host,
                port=parsed.port,
                target=parsed.raw_path,
            )
            headers = [(b"Host", parsed.netloc), *_HEADERS]
            async with pool.stream("GET", request, headers=headers) as response:
                location = _header(response, b"location")
                if response.status in _REDIRECTS and location:
                    target = str(parsed.join(location))
                    continue
                if response.status != 200:
                    raise _Unfetchable(f"HTTP {response.status} from {target}")
                data = await _body(response, limits.max_bytes)
                media_type = _header(response, b"content-type").split(";")[0].strip() or None
            return Media.from_bytes(data, media_type, where=url)
        raise _Unfetchable(f"more than {MAX_REDIRECTS} redirects")
    except _NotAllowed as exc:
        raise MediaError(
            f"could not fetch {url}: {exc.host} has an address fetches may not reach "
            "(loopback, private, link-local or another non-public address); media "
            "fetch_allow_hosts allows a host by name or address",
            param="messages",
        ) from None
    except (
        _Unfetchable,
        MediaError,
        OSError,  # DNS failures (socket.gaierror) among them
        httpx.InvalidURL,
        httpcore.NetworkError,
        httpcore.TimeoutException,
        httpcore.ProtocolError,
        httpcore.UnsupportedProtocol,
    ) as exc:
        log.debug("could not fetch %s: %s: %s", url, type(exc).__name__, exc)
        raise could_not_fetch(url, limits) from None


def could_not_fetch(url: str, limits: MediaConfig) -> MediaError:
    """The one text for every failure of a fetch: it names what a fetch needs, never which
    part went wrong."""
    return MediaError(
        f"could not fetch {url}: it must answer 200 with an image or sound (JPEG, PNG, GIF, "
        f"BMP; WAV, MP3, FLAC) of at most media max_bytes ({limits.max_bytes} bytes), within "
        f"media fetch_timeout ({limits.fetch_timeout:g} s) for all of the request's URLs",
        param="messages",
    )


def _header(response: httpcore.Response, name: bytes) -> str:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


async def _body(response: httpcore.Response, limit: int) -> bytes:
    data = bytearray()
    async for piece in response.aiter_stream():
        data += piece
        if len(data) > limit:
            raise _Unfetchable(f"more than media max_bytes ({limit} bytes)")
    return bytes(data)
