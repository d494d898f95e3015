"""The real `kronk` command line, run as subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kronk_api.options import ServerStartCommand, cli_plugins
from kronk_api.settings import (
    ServerSettings,
    all_settings,
    bind_sections,
    environment_for,
    environment_values,
    load_settings,
    nest,
    other_spellings,
    server_sections,
)
from kronk_core.contract.errors import ConfigError
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID
from kronk_testing.server import free_port

CLI = [sys.executable, "-m", "kronk_api.cli"]


def _environment(**extra: str) -> dict[str, str]:
    """The current environment without any KRONK_* variable, plus `extra`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    env.update(extra)
    return env


def _kronk(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env if env is not None else _environment(),
        timeout=timeout,
        check=False,
    )


def _answers(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/v1/liveness", timeout=2)
    except httpx.TransportError:
        return False
    return True


def _alive(pid: int) -> bool:
    """True while `pid` is a kronk CLI process that has not exited (zombies count as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"kronk_api.cli" in command and "\nState:\tZ" not in status


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["server"],
        ["server", "start"],
        ["server", "stop"],
        ["server", "logs"],
        ["model"],
        ["model", "list"],
        ["run"],
        ["security", "key", "delete"],
        ["security", "token", "create"],
        ["plugins"],
    ],
    ids=lambda command: " ".join(command) or "kronk",
)
def test_help(command: list[str]) -> None:
    result = _kronk(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout
    assert "Traceback" not in result.stderr


def test_console_script_version() -> None:
    script = Path(sys.executable).parent / "kronk"
    if not script.exists():
        pytest.fail(f"console script not installed next to {sys.executable}")
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "version" in result.stdout
    # Where the script is not on PATH: the same command as a module.
    module = subprocess.run(
        [sys.executable, "-m", "kronk", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert module.returncode == 0, module.stderr
    assert module.stdout == result.stdout.replace(script.name, "kronk", 1)


def test_model_list(tmp_path: Path) -> None:
    result = _kronk("model", "list", "--json", env=_environment(KRONK_BASE_PATH=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert DEFAULT_MODEL_ID in [entry["id"] for entry in json.loads(result.stdout)]


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        ("KRONK_API_HOST", "bad-host", "api_host: expected HOST:PORT, got 'bad-host'"),
        # A plugin's setting: its variable is derived by the same rule.
        ("KRONK_AUTH_JWT_ENABLED", "maybe", "auth-jwt.enabled: Input should be a valid boolean"),
    ],
    ids=["core", "plugin"],
)
def test_environment_is_read_without_a_flag(
    tmp_path: Path, variable: str, value: str, error: str
) -> None:
    """A variable alone reaches the settings: a bad value is reported by key, nothing starts."""
    result = _kronk(
        "server",
        "start",
        "--base-path",
        str(tmp_path),
        env=_environment(**{variable: value}),
        timeout=60,
    )
    assert result.returncode != 0
    assert error in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "server.pid").exists()


def test_settings_file_precedence(tmp_path: Path) -> None:
    config = tmp_path / "kronk.yaml"
    config.write_text("api_host: 127.0.0.1:9123\nqueue_wait_seconds: 7\n", encoding="utf-8")
    from_file = load_settings(config, {})
    assert from_file.api_host == "127.0.0.1:9123"
    assert from_file.port == 9123
    assert from_file.queue_wait_seconds == 7
    overridden = load_settings(config, {"api_host": "127.0.0.1:9124"})
    assert overridden.api_host == "127.0.0.1:9124"
    assert overridden.queue_wait_seconds == 7
    assert load_settings(None, {}).api_host == "127.0.0.1:8080"
    config.write_text("models_in_cache: 2\ncache_ttl: 5m\n", encoding="utf-8")
    pool = load_settings(config, {"cache_ttl": "90s"}).kronk_config()
    assert (pool.models_in_cache, pool.cache_ttl) == (2, 90.0)
    config.write_text("api_host: nowhere\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(config, {})
    assert info.value.key == "api_host"


def test_every_setting_reaches_a_detached_server() -> None:
    """-d passes settings as KRONK_* variables: each has one, and lists and flags survive."""
    schema = all_settings(server_sections(cli_plugins()))
    keys = {setting.key for setting in schema}
    assert keys >= set(ServerSettings.model_fields) - {"sections"}
    assert {"auth-jwt.enabled", "auth-jwt.issuer", "auth-jwt.limit_store"} <= keys
    settings = bind_sections(
        ServerSettings(
            cors_origins="https://a.example, https://b.example",  # type: ignore[arg-type]
            sections={"auth-jwt": {"enabled": True}},
        ),
        cli_plugins(),
    )
    environment = environment_for(settings, schema)
    # What was given, no more: the child keeps the rest at their defaults.
    assert environment == {
        "KRONK_CORS_ORIGINS": "https://a.example,https://b.example",
        "KRONK_AUTH_JWT_ENABLED": "true",
    }
    overrides = nest(environment_values(schema, environment))
    assert bind_sections(load_settings(None, overrides), cli_plugins()) == settings


def test_flags_and_variables_follow_one_rule() -> None:
    """A setting's flag and variable come from its dotted key, plugins' sections included."""
    names = {(s.key, s.flag, s.env) for s in all_settings(server_sections(cli_plugins()))}
    assert ("api_host", "--api-host", "KRONK_API_HOST") in names
    assert ("model_config_file", "--model-config-file", "KRONK_MODEL_CONFIG_FILE") in names
    assert ("auth-jwt.limit_store", "--auth-jwt-limit-store", "KRONK_AUTH_JWT_LIMIT_STORE") in names
    schema = all_settings(server_sections(cli_plugins()))
    undescribed = [setting.key for setting in schema if not setting.field.description]
    assert not undescribed, "a setting's description is its flag's help"
    help_text = _kronk("server", "start", "--help").stdout
    for flag in ("--api-host", "--auth-jwt-enabled / --no-auth-jwt-enabled", "--auth-jwt-issuer"):
        assert flag in help_text
    assert "KRONK_AUTH_JWT_ISSUER" in help_text
    assert "--auth-enabled" not in help_text  # other spellings work but are not advertised


def test_other_spellings_work_and_only_deprecated_ones_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The manual's names (`KRONK_WEB_API_HOST`, `KRONK_AUTH_ENABLED`, `--auth-issuer`,
    `auth_issuer:`) work without a warning; this project's own moved ones warn."""
    sections = server_sections(cli_plugins())
    schema, others = all_settings(sections), other_spellings(sections)
    environ = {
        "KRONK_WEB_API_HOST": "127.0.0.1:9001",
        "KRONK_AUTH_ENABLED": "true",
        "KRONK_AUTH_LIMIT_STORE": "sqlite",
        "KRONK_CACHE_MODELS_IN_CACHE": "2",
        "KRONK_MODELS_IN_CACHE": "5",  # the rule's name beats another spelling
    }
    with caplog.at_level("WARNING", logger="kronk_core.settings.sections"):
        values = environment_values(schema, environ, others)
        file = tmp_path / "server.yaml"
        file.write_text("auth_issuer: acme\nauth_limit_store: redis://x:1/0\n", encoding="utf-8")
        from_file = bind_sections(load_settings(file, nest(values), sections), cli_plugins())
        command = ServerStartCommand("start")
        flagged = command.overrides(
            {"other__auth_issuer": "flagged", "setting__auth_jwt__issuer": None}, environ={}
        )
    assert values == {
        "api_host": "127.0.0.1:9001",
        "auth-jwt.enabled": "true",
        "auth-jwt.limit_store": "sqlite",
        "models_in_cache": "5",
    }
    assert from_file.api_host == "127.0.0.1:9001" and from_file.models_in_cache == 5
    auth = from_file.sections["auth-jwt"]
    # The variable (an override) beats the file's deprecated key.
    assert (auth.enabled, auth.issuer, auth.limit_store) == (True, "acme", "sqlite")
    assert flagged["auth-jwt"]["issuer"] == "flagged"
    sections = "kronk_core.settings.sections"
    warned = sorted(r.getMessage() for r in caplog.records if r.name == sections)
    assert warned == [
        f"{old} is deprecated and will be removed in the next release; write {new}"
        for old, new in (
            ("KRONK_AUTH_LIMIT_STORE", "KRONK_AUTH_JWT_LIMIT_STORE"),
            ("auth_limit_store", "auth-jwt.limit_store"),
        )
    ]


def test_plugins_lists_what_each_provides(tmp_path: Path) -> None:
    env = _environment(KRONK_BASE_PATH=str(tmp_path), KRONK_DISABLE_PLUGINS="sampling")
    listed = _kronk("plugins", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    plugins = {entry["name"]: entry for entry in json.loads(listed.stdout)}
    caching = plugins["caching"]
    assert caching["active"] and caching["distribution"] == "kronk-caching 0.1.0"
    assert caching["registered"] == {"cache_strategies": ["imc", "none", "spc"]}
    assert caching["settings"] == {"model": ["caching"]}
    assert "kronk_register_cache_strategies" in caching["hooks"]
    auth = plugins["auth-jwt"]
    assert auth["settings"] == {"server": ["auth-jwt"]}
    assert auth["registered"]["limit_stores"] == ["redis", "rediss", "sqlite", "unix"]
    assert "kronk_register_tool_formats" in plugins["templates"]["hooks"]
    assert "hermes" in plugins["templates"]["registered"]["tool_formats"]
    assert plugins["sampling"] == {
        "name": "sampling",
        "distribution": None,
        "active": False,
        "hooks": [],
        "registered": {},
        "settings": {},
    }
    text = _kronk("plugins", env=env)
    assert "sampling: disabled by configuration" in text.stdout
    assert "  cache_strategies: imc, none, spc" in text.stdout


def test_server_start_logs_stop(tmp_path: Path) -> None:
    """One detached server: the flag beats the environment, then chat, logs and stop.

    The parent gets KRONK_API_HOST=A and --api-host B and must pick B. The
    detached child is started with the resolved settings as KRONK_* variables
    and no flags, so its binding to B also shows the environment used on its own.
    """
    env_port, flag_port = free_port(), free_port()
    base = tmp_path / "home"
    env = _environment(KRONK_API_HOST=f"127.0.0.1:{env_port}")
    pid: int | None = None
    try:
        started = _kronk(
            "server",
            "start",
            "--api-host",
            f"127.0.0.1:{flag_port}",
            "--base-path",
            str(base),
            "--preload",
            "-d",
            env=env,
            timeout=60,
        )
        assert started.returncode == 0, started.stderr
        match = re.search(r"\(pid (\d+)\)", started.stdout)
        assert match, started.stdout
        pid = int(match.group(1))
        assert f"127.0.0.1:{flag_port}" in started.stdout

        url = f"http://127.0.0.1:{flag_port}"
        deadline = time.monotonic() + 60
        ready = None
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(url + "/v1/readiness", timeout=5)
            except httpx.TransportError:
                ready = None
            if ready is not None and ready.status_code == 200:
                break
            assert _alive(pid), (base / "logs" / "server.log").read_text(errors="replace")
            time.sleep(0.2)
        assert ready is not None and ready.status_code == 200, "server not ready within 60 s"
        assert ready.json() == {
            "status": "ready",
            "model": DEFAULT_MODEL_ID,
            "model_state": "loaded",  # --preload: loaded before the server answers at all
            "load": {
                "slots_busy": 0,
                "slots_total": 4,
                "queued": 0,
                "queue_capacity": 64,
                "saturated": False,
            },
        }
        assert not _answers(env_port), "the environment's port answers although a flag was given"
        assert (base / "server.pid").read_text().strip() == str(pid)

        chat = httpx.post(
            url + "/v1/chat/completions",
            json={
                "model": DEFAULT_MODEL_ID,
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 4,
                "temperature": 0,
            },
            timeout=120,
        )
        assert chat.status_code == 200, chat.text
        body = chat.json()
        assert body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] == 4

        logs = _kronk("server", "logs", "--base-path", str(base), env=_environment(), timeout=60)
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout.strip()
        assert str(flag_port) in logs.stdout

        stopped = _kronk("server", "stop", "--base-path", str(base), env=_environment())
        assert stopped.returncode == 0, stopped.stderr
        assert f"pid {pid}" in stopped.stdout
        assert _gone(pid, 5)
        assert not _answers(flag_port)
        assert not (base / "server.pid").exists()
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_server_stop_without_server(tmp_path: Path) -> None:
    result = _kronk("server", "stop", "--base-path", str(tmp_path), timeout=60)
    assert result.returncode != 0
    assert "no running server" in result.stderr


def test_run_answers_a_message_piped_in(tmp_path: Path) -> None:
    result = _kronk(
        "run",
        "--max-tokens",
        "5",
        "--temperature",
        "0",
        env=_environment(KRONK_BASE_PATH=str(tmp_path)),
        stdin="hello\n",
    )
    # A message piped in is answered once, as `ollama run` does: no prompt, no session.
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip() and ">>>" not in result.stdout, result.stdout
