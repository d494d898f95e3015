"""Authentication on a real server: forged tokens, grants per endpoint, quotas, key deletion."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jwt
import openai
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from jwt.algorithms import RSAAlgorithm
from litestar import Litestar, Request, Response, Router, get
from litestar.config.app import AppConfig
from litestar.routes import HTTPRoute

from kronk_api import ServerSettings, create_app
from kronk_api.auth import TOKEN_CHECKER
from kronk_api.cli import main
from kronk_api.endpoints import ENDPOINT_OPT
from kronk_auth_jwt.guard import Authenticator, utc_now
from kronk_core import Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_core.contract.errors import ConfigError, KronkError
from kronk_core.contract.selection import PluginSelection
from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.auth import AuthServer, bearer, mint, serving_with_auth

MODEL = GEMMA_MODEL_ID
CHAT = "/v1/chat/completions"
TOKENIZE = "/v1/tokenize"
MESSAGES = [{"role": "user", "content": "hello"}]
# A small context keeps this server's model cheap; it only ever generates one token.
SMALL_MODEL = {MODEL: ModelConfig(context_window=512, n_seq_max=2)}


def _probe_error(_: Request[Any, Any, Any], exc: KronkError) -> Response[Any]:
    headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    body = {"type": "error", "error": {"type": exc.code, "message": exc.message}}
    return Response(body, status_code=exc.status, headers=headers)


@get("/probe/ping", opt={ENDPOINT_OPT: "probe"})
async def probe_ping() -> dict[str, bool]:
    return {"pong": True}


class ProbeDialect:
    """A second dialect with its own error shape, as the Anthropic one will have."""

    @hookimpl
    def kronk_app(self, app_config: AppConfig) -> None:
        app_config.route_handlers.append(
            Router(
                path="/", route_handlers=[probe_ping], exception_handlers={KronkError: _probe_error}
            )
        )


@contextmanager
def running_auth_server(base: Path, **settings: Any) -> Iterator[AuthServer]:
    """A server with auth on, served from `base`, with the probe dialect beside the built-ins."""
    kronk = Kronk(
        KronkConfig(base_path=base, models=SMALL_MODEL), plugins={"probe": ProbeDialect()}
    )
    with serving_with_auth(kronk, **settings) as server:
        yield server


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    with running_auth_server(tmp_path_factory.mktemp("auth-home")) as server:
        yield server


def kronk_cli(server: AuthServer, *args: str) -> Any:
    env = {"KRONK_TOKEN": server.admin, "KRONK_API_HOST": server.api_host}
    return CliRunner().invoke(main, list(args), env=env)


def assert_openai_error(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error = response.json()["error"]
    assert error["type"] == error_type, error
    assert error["message"]


# ---- forged tokens: each is 401 --------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "iss": "kronk",
        "sub": str(uuid.uuid4()),
        "iat": now,
        "exp": now + 3600,
        "admin": False,
        "endpoints": {"chat-completions": {"limit": 0, "window": "unlimited"}},
    }
    return {key: value for key, value in {**claims, **overrides}.items() if value is not _DROP}


_DROP = object()  # a claim left out


def _signing_key(base: Path) -> tuple[str, rsa.RSAPrivateKey]:
    path = next(p for p in sorted((base / "keys").glob("*.pem")) if p.stem != "master")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    return path.stem, key


@dataclass
class Stranger:
    """Someone else's RSA key, and a local HTTP server that would hand it out (jku, x5u)."""

    key: rsa.RSAPrivateKey
    url: str
    fetched: list[str]

    @property
    def jwk(self) -> dict[str, Any]:
        jwk: dict[str, Any] = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return jwk

    @property
    def certificate(self) -> str:
        """Its self-signed certificate, base64 DER as in an x5c header."""
        pem = _self_signed_certificate(self.key)
        der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
        return base64.b64encode(der).decode()


def _self_signed_certificate(key: rsa.RSAPrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stranger")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def stranger() -> Iterator[Stranger]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    fetched: list[str] = []
    documents = {
        "/jwks.json": json.dumps({"keys": [RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)]}),
        "/cert.pem": _self_signed_certificate(key).decode(),
    }

    class KeyHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            body = documents.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), KeyHandler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield Stranger(key=key, url=f"http://127.0.0.1:{http.server_address[1]}", fetched=fetched)
    finally:
        http.shutdown()
        http.server_close()


def forged_tokens(base: Path, stranger: Stranger) -> dict[str, str]:
    kid, key = _signing_key(base)
    now = int(time.time())

    def signed(signer: rsa.RSAPrivateKey = key, algorithm: str = "RS256", **claims: Any) -> str:
        return jwt.encode(_claims(**claims), signer, algorithm=algorithm, headers={"kid": kid})

    def with_header(signer: rsa.RSAPrivateKey, **header: Any) -> str:
        return jwt.encode(_claims(), signer, algorithm="RS256", headers=header)

    def raw(header: Any, claims: Any = None) -> str:
        """Any JSON as header and claims, signed with the real key (PyJWT would refuse to)."""
        claims = _claims() if claims is None else claims
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"

    valid = signed()
    header, _, signature = valid.split(".")
    granted_more = _b64(json.dumps(_claims(admin=True)).encode())
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    hs_signing_input = (
        f"{_b64(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': kid}).encode())}."
        f"{_b64(json.dumps(_claims()).encode())}"
    )
    hs_signature = hmac.new(public_pem, hs_signing_input.encode(), hashlib.sha256).digest()
    none_header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
    # Outside the key directory: a kid that climbs out of it must not reach this key.
    outside = base / "planted.pem"
    outside.write_bytes(
        stranger.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return {
        "malformed": "not-a-jwt",
        "bad_signature": signed(stranger.key),
        "tampered_claims": f"{header}.{granted_more}.{signature}",
        "unknown_kid": with_header(stranger.key, kid=str(uuid.uuid4())),
        "no_kid": jwt.encode(_claims(), key, algorithm="RS256"),
        "expired": signed(exp=now - 60),
        "wrong_issuer": signed(iss="someone-else"),
        "alg_none": f"{none_header}.{_b64(json.dumps(_claims()).encode())}.",
        "hs256_with_public_key": f"{hs_signing_input}.{_b64(hs_signature)}",
        "missing_exp": signed(exp=_DROP),
        "missing_sub": signed(sub=_DROP),
        "empty_sub": signed(sub=""),
        "exp_as_string": signed(exp=str(now + 3600)),
        "exp_not_a_number": signed(exp="soon"),
        "future_nbf": signed(nbf=now + 3600),
        "future_iat": signed(iat=now + 3600),
        "rs512_with_the_real_key": signed(algorithm="RS512"),
        "ps256_with_the_real_key": signed(algorithm="PS256"),
        "admin_signed_by_a_user_key": signed(admin=True),
        "admin_as_string": signed(admin="true", endpoints={}),
        "kid_path_traversal": with_header(stranger.key, kid="../planted"),
        "kid_absolute_path": with_header(stranger.key, kid=str(outside.with_suffix(""))),
        "jwk_header_names_the_signer": with_header(stranger.key, kid=kid, jwk=stranger.jwk),
        "jwk_header_without_kid": with_header(stranger.key, jwk=stranger.jwk),
        "jku_header": with_header(stranger.key, kid=kid, jku=f"{stranger.url}/jwks.json"),
        "x5u_header": with_header(stranger.key, kid=kid, x5u=f"{stranger.url}/cert.pem"),
        "x5c_header": with_header(stranger.key, kid=kid, x5c=[stranger.certificate]),
        **malformed_tokens(kid, raw),
    }


def malformed_tokens(kid: str, raw: Any) -> dict[str, str]:
    """Tokens whose header or claims are not what a JWT's should be, signed with the real key."""
    rs256 = {"alg": "RS256", "typ": "JWT"}
    return {
        "kid_a_number": raw({**rs256, "kid": 1}),
        "kid_null": raw({**rs256, "kid": None}),
        "kid_a_list": raw({**rs256, "kid": [kid]}),
        "kid_an_object": raw({**rs256, "kid": {"id": kid}}),
        "kid_with_a_lone_surrogate": raw({**rs256, "kid": kid + "\ud800"}),
        "crit_header": raw({**rs256, "kid": kid, "crit": ["exp"]}),
        "crit_not_a_list": raw({**rs256, "kid": kid, "crit": "exp"}),
        "alg_a_list": raw({"alg": ["RS256"], "kid": kid}),
        "header_a_string": raw("RS256"),
        "header_a_list": raw([rs256]),
        "claims_a_list": raw({**rs256, "kid": kid}, [_claims()]),
        "claims_a_number": raw({**rs256, "kid": kid}, 7),
        "aud_claim": raw({**rs256, "kid": kid}, _claims(aud="someone")),
        "iss_a_list": raw({**rs256, "kid": kid}, _claims(iss=["kronk"])),
        "sub_an_object": raw({**rs256, "kid": kid}, _claims(sub={"id": "x"})),
        "endpoints_a_list": raw({**rs256, "kid": kid}, _claims(endpoints=["chat-completions"])),
        "exp_nan": raw({**rs256, "kid": kid}, _claims(exp=float("nan"))),
    }


FORGERIES = [
    "malformed",
    "bad_signature",
    "tampered_claims",
    "unknown_kid",
    "no_kid",
    "expired",
    "wrong_issuer",
    "alg_none",
    "hs256_with_public_key",
    "missing_exp",
    "missing_sub",
    "empty_sub",
    "exp_as_string",
    "exp_not_a_number",
    "future_nbf",
    "future_iat",
    "rs512_with_the_real_key",
    "ps256_with_the_real_key",
    "admin_signed_by_a_user_key",
    "admin_as_string",
    "kid_path_traversal",
    "kid_absolute_path",
    "jwk_header_names_the_signer",
    "jwk_header_without_kid",
    "jku_header",
    "x5u_header",
    "x5c_header",
    "kid_a_number",
    "kid_null",
    "kid_a_list",
    "kid_an_object",
    "kid_with_a_lone_surrogate",
    "crit_header",
    "crit_not_a_list",
    "alg_a_list",
    "header_a_string",
    "header_a_list",
    "claims_a_list",
    "claims_a_number",
    "aud_claim",
    "iss_a_list",
    "sub_an_object",
    "endpoints_a_list",
    "exp_nan",
]


@pytest.mark.parametrize("forgery", FORGERIES)
def test_forged_token_is_401(auth_server: AuthServer, stranger: Stranger, forgery: str) -> None:
    token = forged_tokens(auth_server.base, stranger)[forgery]
    client = openai.OpenAI(base_url=f"{auth_server.base_url}/v1", api_key=token, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert caught.value.status_code == 401
    body = caught.value.response.json()
    assert body["error"]["type"] == "authentication_error", body
    assert stranger.fetched == []  # no header made the server fetch a key


def test_admin_tokens_need_the_master_key(auth_server: AuthServer) -> None:
    """An admin claim signed by a user key is refused outright, not downgraded."""
    kid, key = _signing_key(auth_server.base)
    forged = jwt.encode(_claims(admin=True), key, algorithm="RS256", headers={"kid": kid})
    with httpx.Client(base_url=auth_server.base_url) as http:
        refused = http.get("/v1/kronk/slots", headers=bearer(forged))
        assert_openai_error(refused, 401, "authentication_error")
        assert refused.json()["error"]["message"] == "admin tokens must be signed by the master key"
        assert http.get("/v1/kronk/slots", headers=bearer(auth_server.admin)).status_code == 200


@pytest.mark.model
def test_key_headers_are_ignored_on_a_genuine_token(
    auth_server: AuthServer, stranger: Stranger
) -> None:
    """jku, jwk and x5u neither choose the key nor make a good token fail."""
    kid, key = _signing_key(auth_server.base)
    header = {
        "kid": kid,
        "jwk": stranger.jwk,
        "jku": f"{stranger.url}/jwks.json",
        "x5u": f"{stranger.url}/cert.pem",
    }
    token = jwt.encode(_claims(), key, algorithm="RS256", headers=header)
    client = openai.OpenAI(base_url=f"{auth_server.base_url}/v1", api_key=token, max_retries=0)
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert completion.choices[0].finish_reason in ("length", "stop")
    assert stranger.fetched == []


@pytest.mark.parametrize(
    "authorization", [None, "", "Basic dXNlcjpwYXNz", "Bearer", "Token abc.def.ghi"], ids=repr
)
def test_missing_or_non_bearer_credentials_are_401(
    auth_server: AuthServer, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = httpx.post(
        f"{auth_server.base_url}{CHAT}",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1},
        headers=headers,
    )
    assert_openai_error(response, 401, "authentication_error")


@pytest.mark.model
def test_an_untampered_copy_of_a_forgery_base_is_accepted(auth_server: AuthServer) -> None:
    """The forgeries fail for what was forged: the same claims, signed properly, pass."""
    kid, key = _signing_key(auth_server.base)
    token = jwt.encode(_claims(), key, algorithm="RS256", headers={"kid": kid})
    client = openai.OpenAI(base_url=f"{auth_server.base_url}/v1", api_key=token, max_retries=0)
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert completion.choices[0].finish_reason in ("length", "stop")


# ---- bodies are read only for callers let in ---------------------------------------


@pytest.fixture(scope="module")
def small_body_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    base = tmp_path_factory.mktemp("small-body-home")
    with running_auth_server(base, max_request_bytes=4096) as server:
        yield server


def test_an_oversized_body_without_a_token_is_401_not_413(small_body_server: AuthServer) -> None:
    big = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * 65536}]}
    ).encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length
        for start in range(0, len(big), 4096):
            yield big[start : start + 4096]

    json_type = {"content-type": "application/json"}
    with httpx.Client(base_url=small_body_server.base_url, timeout=30) as http:
        for credentials in ({}, bearer("not-a-jwt"), {"x-api-key": "nope"}):
            sized = http.post(CHAT, content=big, headers={**json_type, **credentials})
            assert_openai_error(sized, 401, "authentication_error")
            streamed = http.post(CHAT, content=chunks(), headers={**json_type, **credentials})
            assert_openai_error(streamed, 401, "authentication_error")
        admitted = http.post(
            CHAT, content=big, headers={**json_type, **bearer(small_body_server.admin)}
        )
        assert_openai_error(admitted, 413, "invalid_request_error")
        assert admitted.json()["error"]["code"] == "request_too_large"


# ---- grants: every route the app has -------------------------------------------


# Who may call what, written out: every method and path the auth server's app serves (its
# plugins' routes included), by the access it must have. Each path also answers OPTIONS,
# open to all (CORS preflights carry no credentials).
PUBLIC_ROUTES = [
    ("GET", "/"),
    ("GET", "/ui/{name}"),
    ("GET", "/ui/vendor/{name}"),
    ("GET", "/v1/liveness"),
    ("GET", "/v1/readiness"),
    ("GET", "/health"),
    ("GET", "/v1/health"),
    ("GET", "/api/version"),
    ("GET", "/v1/kronk/ui/reference"),
]
ANY_TOKEN_ROUTES = [
    # What it answers is the check of that token for an endpoint (auth-jwt.host).
    ("POST", "/v1/kronk/security/authenticate"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/v1/example/greeting"),
    ("GET", "/api/tags"),
    ("GET", "/api/ps"),
    ("POST", "/api/show"),
    ("GET", "/lora-adapters"),
]
GRANTED_ROUTES = {
    "chat-completions": [("POST", "/v1/chat/completions")],
    "completions": [("POST", "/v1/completions"), ("POST", "/infill")],
    "responses": [
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/{response_id}"),
        ("DELETE", "/v1/responses/{response_id}"),
    ],
    "messages": [("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")],
    "embeddings": [("POST", "/v1/embeddings")],
    "rerank": [("POST", "/v1/rerank"), ("POST", "/v1/reranking")],
    "tokenize": [
        ("POST", "/v1/tokenize"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/v1/detokenize"),
    ],
    "probe": [("GET", "/probe/ping")],
    "ollama-chat": [("POST", "/api/chat")],
    "ollama-generate": [("POST", "/api/generate")],
    "ollama-embed": [("POST", "/api/embed"), ("POST", "/api/embeddings")],
    "transcriptions": [("POST", "/v1/audio/transcriptions"), ("POST", "/v1/audio/translations")],
}
ADMIN_ROUTES = [
    ("GET", "/metrics"),  # the debug plugin's, with debug.api_metrics on (404 here)
    ("GET", "/v1/kronk/slots"),
    ("GET", "/v1/kronk/ui/live"),
    ("GET", "/v1/kronk/devices"),
    ("GET", "/v1/kronk/models"),
    ("POST", "/v1/kronk/models/{model_id}/unload"),
    ("DELETE", "/v1/kronk/models/{model_id}"),
    ("POST", "/api/pull"),  # Ollama's, as the catalog's pulls and `kronk model rm`
    ("DELETE", "/api/delete"),
    ("POST", "/lora-adapters"),  # llama-server's: the scales every later request gets
    # The Kronk manual's operator routes.
    ("GET", "/v1/kronk/models/ps"),
    ("GET", "/v1/kronk/models/imc-sessions"),
    ("GET", "/v1/pool/budget"),
    ("GET", "/v1/devices"),
    ("GET", "/v1/kronk/libs"),
    ("GET", "/v1/kronk/catalog"),
    ("GET", "/v1/kronk/catalog/{model_id}"),
    ("POST", "/v1/kronk/catalog/update"),
    ("POST", "/v1/kronk/catalog/templates/update"),
    ("GET", "/v1/kronk/pulls"),
    ("POST", "/v1/kronk/pulls"),
    ("GET", "/v1/kronk/pulls/{pull_id}"),
    ("GET", "/v1/kronk/pulls/{pull_id}/events"),
    ("GET", "/v1/kronk/security/keys"),
    ("POST", "/v1/kronk/security/keys"),
    ("DELETE", "/v1/kronk/security/keys/{key_id}"),
    ("POST", "/v1/kronk/security/tokens"),
]
# Path parameters that name nothing: a route called with its grant answers 404 or 400,
# never unloads the model or deletes a key.
PATH_VALUES = {
    "{name}": "index.html",
    "{model_id}": "no-such-model",
    "{response_id}": "resp_none",
    "{pull_id}": "no-such-pull",
    "{key_id}": "no-such-key",
}


def served_routes(app: Litestar) -> set[tuple[str, str]]:
    """(method, path template) for every HTTP route of the app."""
    return {
        (method, route.path_format)
        for route in app.routes
        if isinstance(route, HTTPRoute)
        for handler in route.route_handlers
        for method in handler.http_methods
    }


def _url(path: str) -> str:
    for placeholder, value in PATH_VALUES.items():
        path = path.replace(placeholder, value)
    return path


@pytest.mark.model
def test_the_route_table_is_every_route_the_app_serves(auth_server: AuthServer) -> None:
    written = [*PUBLIC_ROUTES, *ANY_TOKEN_ROUTES, *ADMIN_ROUTES]
    written += [route for routes in GRANTED_ROUTES.values() for route in routes]
    assert len(written) == len(set(written)), "a route is written twice"
    served = served_routes(auth_server.app)
    preflights = {(method, path) for method, path in served if method == "OPTIONS"}
    assert served - preflights == set(written)
    assert preflights == {("OPTIONS", path) for _, path in written}


def _statuses(
    client: httpx.Client, method: str, path: str, *tokens: str | None
) -> list[tuple[int, str]]:
    answers = []
    for token in tokens:
        headers = {} if token is None else bearer(token)
        response = client.request(method, _url(path), json={}, headers=headers)
        answers.append((response.status_code, response.text[:200]))
    return answers


def test_every_route_answers_as_the_table_says(auth_server: AuthServer) -> None:
    """Each route without a token, with a token lacking its grant, and with one holding it."""
    every_grant = ",".join(GRANTED_ROUTES)
    unrelated = mint(auth_server, "some-other-endpoint")
    with httpx.Client(base_url=auth_server.base_url, timeout=60) as client:
        for method, path in PUBLIC_ROUTES:
            (anonymous,) = _statuses(client, method, path, None)
            assert anonymous[0] not in (401, 403), (method, path, anonymous)
        for method, path in ANY_TOKEN_ROUTES:
            anonymous, with_any = _statuses(client, method, path, None, unrelated)
            assert anonymous[0] == 401, (method, path, anonymous)
            assert with_any[0] not in (401, 403), (method, path, with_any)
        for grant, routes in GRANTED_ROUTES.items():
            others = mint(auth_server, ",".join(g for g in GRANTED_ROUTES if g != grant))
            holder = mint(auth_server, grant)
            for method, path in routes:
                anonymous, without, granted = _statuses(client, method, path, None, others, holder)
                where = (method, path, grant)
                assert anonymous[0] == 401, (where, anonymous)
                assert without[0] == 403, (where, without)
                assert granted[0] not in (401, 403), (where, granted)
        user = mint(auth_server, every_grant)
        for method, path in ADMIN_ROUTES:
            anonymous, with_user, with_admin = _statuses(
                client, method, path, None, user, auth_server.admin
            )
            assert anonymous[0] == 401, (method, path, anonymous)
            assert with_user[0] == 403, (method, path, with_user)
            assert with_admin[0] not in (401, 403), (method, path, with_admin)
        for path in {path for _, path in served_routes(auth_server.app)}:
            (preflight,) = _statuses(client, "OPTIONS", path, None)
            assert preflight[0] not in (401, 403), (path, preflight)


@pytest.mark.model
def test_grants_are_honoured_per_endpoint(auth_server: AuthServer) -> None:
    token = mint(auth_server, "chat-completions,tokenize:unlimited")
    client = openai.OpenAI(base_url=f"{auth_server.base_url}/v1", api_key=token, max_retries=0)
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert completion.choices[0].message is not None
    assert MODEL in [model.id for model in client.models.list()]
    with httpx.Client(base_url=auth_server.base_url, headers=bearer(token)) as http:
        assert http.post(TOKENIZE, json={"model": MODEL, "input": "hi"}).status_code == 200
        probe = http.get("/probe/ping")
        assert probe.status_code == 403
        assert http.get("/v1/kronk/slots").status_code == 403

    chat_only = mint(auth_server, "chat-completions:5/day")
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=f"{auth_server.base_url}/v1", api_key=chat_only, max_retries=0).post(
            "/tokenize", body={"model": MODEL, "input": "hi"}, cast_to=object
        )


def test_guard_errors_come_in_each_dialects_shape(auth_server: AuthServer) -> None:
    token = mint(auth_server, "tokenize")
    probe = httpx.get(f"{auth_server.base_url}/probe/ping", headers=bearer(token))
    assert probe.status_code == 403
    assert probe.json() == {
        "type": "error",
        "error": {
            "type": "permission_denied",
            "message": "token does not grant the 'probe' endpoint",
        },
    }
    anonymous = httpx.get(f"{auth_server.base_url}/probe/ping")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["type"] == "invalid_token"
    chat = httpx.post(f"{auth_server.base_url}{CHAT}", json={}, headers=bearer(token))
    assert_openai_error(chat, 403, "permission_error")


@pytest.mark.model
def test_anthropic_clients_authenticate_with_x_api_key(auth_server: AuthServer) -> None:
    """The anthropic SDK sends ANTHROPIC_API_KEY as x-api-key, not as a bearer token."""
    request: dict[str, Any] = {"model": MODEL, "messages": MESSAGES}
    token = mint(auth_server, "messages")
    client = anthropic.Anthropic(base_url=auth_server.base_url, api_key=token, max_retries=0)
    assert client.messages.count_tokens(**request).input_tokens > 0
    chat_only = mint(auth_server, "chat-completions")
    denied = anthropic.Anthropic(base_url=auth_server.base_url, api_key=chat_only, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        denied.messages.count_tokens(**request)
    assert info.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    forged = anthropic.Anthropic(base_url=auth_server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        forged.messages.count_tokens(**request)


@pytest.mark.model
def test_health_stays_open_and_admin_passes_everywhere(auth_server: AuthServer) -> None:
    with httpx.Client(base_url=auth_server.base_url) as http:
        assert http.get("/v1/liveness").status_code == 200
        assert http.get("/v1/readiness").status_code == 200
        admin = bearer(auth_server.admin)
        assert http.get("/probe/ping", headers=admin).status_code == 200
        assert http.get("/v1/kronk/slots", headers=admin).status_code == 200
        for _ in range(3):
            response = http.post(TOKENIZE, json={"model": MODEL, "input": "hi"}, headers=admin)
            assert response.status_code == 200


# ---- quotas ------------------------------------------------------------------------


@dataclass
class SettableClock:
    """The guard's clock, moved by the test instead of waiting for midnight."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(auth_server: AuthServer) -> Iterator[SettableClock]:
    auth: Authenticator = auth_server.app.state[TOKEN_CHECKER]
    settable = SettableClock(datetime(2031, 1, 31, 23, 59, 59, tzinfo=UTC))
    auth.clock = settable
    try:
        yield settable
    finally:
        auth.clock = utc_now


@pytest.mark.model
async def test_hundred_concurrent_requests_admit_exactly_the_quota(
    auth_server: AuthServer, clock: SettableClock
) -> None:
    clock.now = datetime(2031, 3, 14, 12, tzinfo=UTC)  # one day for all of them
    token = mint(auth_server, "tokenize:10/day")
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=auth_server.base_url, headers=bearer(token), limits=limits, timeout=60
    ) as client:
        responses = await asyncio.gather(
            *(client.post(TOKENIZE, json={"model": MODEL, "input": f"hi {n}"}) for n in range(100))
        )
    statuses = [response.status_code for response in responses]
    assert statuses.count(200) == 10, statuses
    assert statuses.count(429) == 90, statuses
    for response in responses:
        if response.status_code == 429:
            assert_openai_error(response, 429, "rate_limit_error")
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
            assert 0 < int(response.headers["retry-after"]) <= 86400


@pytest.mark.model
def test_validation_failures_count_against_the_quota(
    auth_server: AuthServer, clock: SettableClock
) -> None:
    """The call is counted when it passes the grant check, before its body is validated."""
    clock.now = datetime(2031, 3, 14, 12, tzinfo=UTC)  # one day for all of them
    token = mint(auth_server, "chat-completions:2/day")
    with httpx.Client(base_url=auth_server.base_url, headers=bearer(token)) as http:
        for invalid in ({"model": MODEL}, {"model": MODEL, "messages": MESSAGES, "n": 0}):
            assert_openai_error(http.post(CHAT, json=invalid), 400, "invalid_request_error")
        valid = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
        assert_openai_error(http.post(CHAT, json=valid), 429, "rate_limit_error")


@pytest.mark.model
def test_quota_windows_roll_over_in_the_running_server(
    auth_server: AuthServer, clock: SettableClock
) -> None:
    token = mint(auth_server, "tokenize:1/day,chat-completions:1/month")
    tokenize = {"model": MODEL, "input": "hi"}
    # Counted, then answered 404: no model has to run for the quota to be used.
    chat = {"model": "no-such-model", "messages": MESSAGES}

    def calls() -> list[tuple[int, str | None]]:
        with httpx.Client(base_url=auth_server.base_url, headers=bearer(token)) as http:
            responses = [http.post(TOKENIZE, json=tokenize), http.post(CHAT, json=chat)]
        return [(r.status_code, r.headers.get("retry-after")) for r in responses]

    assert calls() == [(200, None), (404, None)]  # 23:59:59 on 31 January
    assert calls() == [(429, "1"), (429, "1")]  # one second to the next day and month
    clock.now = datetime(2031, 2, 1, tzinfo=UTC)
    assert calls() == [(200, None), (404, None)]  # a new day and a new month
    assert calls() == [(429, str(86400)), (429, str(28 * 86400))]
    clock.now = datetime(2031, 2, 2, 12, tzinfo=UTC)
    assert calls() == [(200, None), (429, str(26 * 86400 + 12 * 3600))]


# ---- keys --------------------------------------------------------------------------


@pytest.mark.model
def test_key_deletion_invalidates_its_tokens_at_once(auth_server: AuthServer) -> None:
    created = kronk_cli(auth_server, "security", "key", "create")
    assert created.exit_code == 0, created.output
    key_id = created.output.strip()
    listed = kronk_cli(auth_server, "security", "key", "list")
    assert key_id in listed.output and "master" in listed.output

    made = kronk_cli(
        auth_server, "security", "token", "create", "--duration", "1h", "--endpoints", "tokenize"
    )
    assert made.exit_code == 0, made.output
    token = made.output.strip()
    assert jwt.get_unverified_header(token)["kid"] == key_id  # the newest key signs
    url = f"{auth_server.base_url}{TOKENIZE}"
    body = {"model": MODEL, "input": "hi"}
    assert httpx.post(url, json=body, headers=bearer(token)).status_code == 200

    deleted = kronk_cli(auth_server, "security", "key", "delete", "--keyid", key_id)
    assert deleted.exit_code == 0, deleted.output
    assert_openai_error(
        httpx.post(url, json=body, headers=bearer(token)), 401, "authentication_error"
    )


def test_master_key_refuses_deletion(auth_server: AuthServer) -> None:
    base = str(auth_server.base)
    remote = kronk_cli(auth_server, "security", "key", "delete", "--keyid", "master")
    assert remote.exit_code != 0
    assert "master key cannot be deleted" in remote.output
    local = CliRunner().invoke(
        main,
        ["security", "key", "delete", "--keyid", "master", "--local", "--base-path", base],
    )
    assert local.exit_code != 0
    assert "master key cannot be deleted" in local.output
    assert (auth_server.base / "keys" / "master.pem").exists()
    assert httpx.get(
        f"{auth_server.base_url}/v1/kronk/slots", headers=bearer(auth_server.admin)
    ).is_success


def test_a_key_deleted_by_another_process_stops_verifying_at_once(
    auth_server: AuthServer,
) -> None:
    """Revocation does not hang on the directory's timestamp.

    The key is deleted by a second process, and the directory's modification
    time is then put back, as a file system with coarse timestamps would leave it.
    """
    local = ["--local", "--base-path", str(auth_server.base)]
    runner = CliRunner()
    created = runner.invoke(main, ["security", "key", "create", *local])
    assert created.exit_code == 0, created.output
    key_id = created.output.strip()
    made = runner.invoke(
        main,
        ["security", "token", "create", "--duration", "10m", "--endpoints", "tokenize", *local],
    )
    assert made.exit_code == 0, made.output
    token = made.output.strip()
    url = f"{auth_server.base_url}{TOKENIZE}"
    body = {"model": MODEL, "input": "hi"}
    assert httpx.post(url, json=body, headers=bearer(token)).status_code == 200

    directory = (auth_server.base / "keys").stat()
    environment = {key: value for key, value in os.environ.items() if key != "KRONK_TOKEN"}
    delete = ["security", "key", "delete", "--keyid", key_id, *local]
    deleted = subprocess.run(
        [sys.executable, "-m", "kronk_api.cli", *delete],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert deleted.returncode == 0, deleted.stderr
    os.utime(auth_server.base / "keys", ns=(directory.st_atime_ns, directory.st_mtime_ns))
    assert (auth_server.base / "keys").stat().st_mtime_ns == directory.st_mtime_ns
    refused = httpx.post(url, json=body, headers=bearer(token))
    assert_openai_error(refused, 401, "authentication_error")
    assert "unknown or deleted key" in refused.json()["error"]["message"]


def test_auth_without_an_authenticating_plugin_refuses_to_start(tmp_path: Path) -> None:
    selection = PluginSelection(disabled=["auth-jwt"])
    kronk = Kronk(KronkConfig(base_path=tmp_path, plugins=selection))
    settings = ServerSettings(base_path=tmp_path, sections={"auth-jwt": {"enabled": True}})
    with pytest.raises(ConfigError, match="no active plugin reads this section") as info:
        create_app(settings, kronk=kronk)
    assert info.value.key == "auth-jwt"
    assert "'auth-jwt' is disabled" in str(info.value)


def test_model_ps_sends_the_token(auth_server: AuthServer) -> None:
    """`kronk model ps` against a server with auth on: KRONK_TOKEN or --token, as `security`."""
    runner = CliRunner()
    ps = ["model", "ps", "--api-host", auth_server.api_host]
    anonymous = runner.invoke(main, ps, env={"KRONK_TOKEN": None})
    assert anonymous.exit_code == 1
    assert "401: missing bearer token" in anonymous.output
    user = mint(auth_server, "tokenize")
    denied = runner.invoke(main, [*ps, "--token", user], env={"KRONK_TOKEN": None})
    assert denied.exit_code == 1
    assert "403: this endpoint needs an admin token" in denied.output
    listed = runner.invoke(main, ps, env={"KRONK_TOKEN": auth_server.admin})
    assert listed.exit_code == 0, listed.output
    assert listed.output.startswith("ID ") and "places in use" in listed.output


def test_key_files_are_private(auth_server: AuthServer) -> None:
    keys = auth_server.base / "keys"
    assert keys.stat().st_mode & 0o777 == 0o700
    assert (keys / "master.pem").stat().st_mode & 0o777 == 0o600
    for path in keys.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
