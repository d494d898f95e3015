"""The browser UI in a real headless Chromium (Debian's, driven by Playwright) against a
real server: a streamed chat, answers rendered as sanitized Markdown (a hostile one
included), a catalog pull whose progress reaches 100%, a model deleted from the models
page, and a token created with auth on. Screenshots of every page are kept in a temporary
directory the run prints, never in the source tree (docs/images is refreshed from there by
hand)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Dialog, Locator, Page, expect

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig
from kronk_core.settings.config import parse_model_config
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, GEMMA_MODEL_ID
from kronk_testing.cli import kronk_at
from kronk_testing.file_server import FileServer, Served
from kronk_testing.plugin import ScriptedKronk
from kronk_testing.pulls import TINY_PATH, write_catalog
from kronk_testing.scripted import CHATML, Script
from kronk_testing.templates import THINKING_GEMMA
from kronk_ui.plugin import CONTENT_SECURITY_POLICY, VENDOR

SMALL = {"context_window": 512, "n_seq_max": 1, "cache": "none"}
# The default model under a template that opens a <think> block it never closes: all it
# writes is reasoning.
THINKING_MODEL = "thinking-gemma"

# Scripted models (no llama.cpp) that answer fixed Markdown. The first thinks aloud: its
# template opens a <think> block that its answer closes.
MARKDOWN_MODEL = "markdown"
HOSTILE_MODEL = "hostile"
THINKING_CHATML = CHATML.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")
MARKDOWN_ANSWER = (
    "Light **scatters** off `air`.\n</think>\n"
    "# Tides\n\n- **Spring** tides\n- Neap tides\n\n"
    "```python\nprint('moon')\n```\n\nSee [the docs](https://example.com/tides).\n"
)
# Each way an answer could try to run script in the page: HTML (an event handler, a script
# element, a javascript: link) and Markdown (a javascript: link, a javascript: image).
HOSTILE_HTML = [
    '<img src="x" onerror="window.__pwned=1">',
    "<script>window.__pwned=2</script>",
    '<a href="javascript:window.__pwned=4">here</a>',
]
HOSTILE_ANSWER = "\n\n".join(
    [*HOSTILE_HTML, "[click](javascript:window.__pwned=3)", "![pic](javascript:window.__pwned=5)"]
)


SOURCE_TREE = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ui-screenshots").resolve()
    # pytest's temporary directory could be put in the checkout (--basetemp): refuse it.
    assert not folder.is_relative_to(SOURCE_TREE), f"screenshots would land in {folder}"
    print(f"UI screenshots: {folder}")
    return folder


def shoot(page: Page, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"ui-{name}.png"), full_page=True)


@pytest.fixture
def ui_server(
    tmp_path: Path, tiny_llama_path: Path, gemma_path: str, serve: Any
) -> Iterator[tuple[str, FileServer]]:
    write_catalog(tmp_path, tiny_llama_path)
    template = tmp_path / "thinking-gemma.jinja"
    template.write_text(THINKING_GEMMA, encoding="utf-8")
    thinking = {**SMALL, "model_path": gemma_path, "templates": {"template": str(template)}}
    models = {
        # The default model, instruction-tuned: the chat's screenshot shows an answer.
        DEFAULT_MODEL_ID: parse_model_config(DEFAULT_MODEL_ID, SMALL),
        THINKING_MODEL: parse_model_config(THINKING_MODEL, thinking),
    }
    with FileServer() as hub:
        kronk = Kronk(KronkConfig(base_path=tmp_path, models=models))
        settings = ServerSettings(
            base_path=tmp_path, sections={"catalog": {"hf_endpoint": hub.url}}
        )
        with serve(create_app(settings, kronk=kronk)) as base_url:
            yield base_url, hub


@pytest.fixture
def scripted_ui(
    tmp_path: Path, tiny_llama_path: Path, scripted_kronk: ScriptedKronk, serve: Any
) -> Iterator[str]:
    """A server of scripted models that answer Markdown, with a model installed under
    <base>/models (tiny) that can be deleted."""
    (tmp_path / "models").mkdir()
    shutil.copy(tiny_llama_path, tmp_path / "models" / "tiny.gguf")
    template = tmp_path / "thinking-chatml.jinja"
    template.write_text(THINKING_CHATML, encoding="utf-8")
    models = {
        MARKDOWN_MODEL: {
            "script": Script(default=MARKDOWN_ANSWER, decode_seconds=0.01),
            "templates": {"template": str(template)},
        },
        HOSTILE_MODEL: {"script": Script(default=HOSTILE_ANSWER)},
    }
    kronk = scripted_kronk(models, base_path=tmp_path)
    with serve(create_app(ServerSettings(base_path=tmp_path), kronk=kronk)) as base_url:
        yield base_url


def ask(page: Page, model: str, text: str) -> Locator:
    """Send `text` to `model` in Chat; the answer's element, still streaming."""
    page.select_option("#chat-model", model)
    page.fill("#chat-max-tokens", "400")
    page.fill("#chat-text", text)
    page.click("#chat-send")
    return page.locator(".msg.assistant").last


def test_the_page_and_its_assets_carry_the_content_security_policy(
    ui_server: tuple[str, FileServer],
) -> None:
    base_url, _ = ui_server
    for path, kind in (
        ("/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
        ("/ui/vendor/marked.umd.js", "text/javascript"),
        ("/ui/vendor/purify.min.js", "text/javascript"),
    ):
        response = httpx.get(base_url + path)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith(kind)
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
    index = httpx.get(base_url + "/").text
    assert "<script>" not in index and " style=" not in index and "onclick" not in index
    assert (
        "script-src 'self'" in CONTENT_SECURITY_POLICY
        and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    )
    assert httpx.get(base_url + "/ui/missing.js").status_code == 404
    assert httpx.get(base_url + "/ui/..%2Fplugin.py").status_code == 404
    assert httpx.get(base_url + "/ui/vendor/README.md").status_code == 404
    # Every script is the server's own: nothing from a CDN.
    assert re.findall(r'src="([^"]+\.js)"', index) == [
        "/ui/vendor/marked.umd.js",
        "/ui/vendor/purify.min.js",
        "/ui/app.js",
    ]


def test_the_vendored_files_are_the_ones_their_readme_names() -> None:
    """scripts/vendor_ui.py copies them from npm and records each file's SHA-256; a file
    changed by hand since, or left out of the package, fails here."""
    readme = VENDOR.joinpath("README.md").read_text(encoding="utf-8")
    assert "## marked 18.2.1" in readme and "## dompurify 3.5.0" in readme
    recorded = dict(re.findall(r"- `([^`]+)` sha256 `([0-9a-f]{64})`", readme))
    assert {"marked.umd.js", "purify.min.js", "marked.LICENSE", "dompurify.LICENSE"} <= set(
        recorded
    )
    for name, digest in recorded.items():
        assert hashlib.sha256(VENDOR.joinpath(name).read_bytes()).hexdigest() == digest, name


def test_an_answer_renders_as_markdown_while_it_streams(
    scripted_ui: str, page: Page, screenshots: Path
) -> None:
    page.goto(f"{scripted_ui}/#/chat")
    answer = ask(page, MARKDOWN_MODEL, "Tell me about **tides** <b>now</b>")
    content = answer.locator(".content")
    # Rendered as it arrives, not only once the answer is complete.
    expect(page.locator(".msg.assistant.streaming .content h1")).to_have_text("Tides")
    expect(answer).to_have_attribute("data-done", "true", timeout=30_000)
    expect(content.locator("h1")).to_have_text("Tides")
    expect(content.locator("ul > li")).to_have_count(2)
    expect(content.locator("li strong")).to_have_text("Spring")
    expect(content.locator("pre > code")).to_have_text("print('moon')\n")
    link = content.locator("a")
    expect(link).to_have_attribute("href", "https://example.com/tides")
    expect(link).to_have_attribute("rel", "noopener noreferrer")
    expect(link).to_have_attribute("target", "_blank")
    reasoning = answer.locator("details.reasoning .text")
    expect(reasoning.locator("strong")).to_have_text("scatters")
    expect(reasoning.locator("code")).to_have_text("air")
    # The user's own message is text as typed, never markup.
    user = page.locator(".msg.user .content")
    expect(user).to_have_text("Tell me about **tides** <b>now</b>")
    expect(user.locator("strong, b")).to_have_count(0)
    shoot(page, screenshots, "chat-markdown")


def test_a_hostile_answer_runs_no_script(scripted_ui: str, page: Page) -> None:
    page.goto(f"{scripted_ui}/#/chat")
    answer = ask(page, HOSTILE_MODEL, "Say something nasty.")
    expect(answer).to_have_attribute("data-done", "true", timeout=30_000)
    content = answer.locator(".content")
    # HTML in an answer is shown as text, never parsed into the page.
    for html in HOSTILE_HTML:
        expect(content).to_contain_text(html)
    assert content.locator("script, img[onerror], [onerror]").count() == 0
    # What Markdown makes of the links and the image keeps no javascript: URL.
    expect(content.locator("a")).to_have_count(1)
    expect(content.locator("img")).to_have_count(1)
    urls = content.locator("a, img").evaluate_all(
        "nodes => nodes.map(node => node.getAttribute('href') ?? node.getAttribute('src'))"
    )
    assert not any((url or "").strip().lower().startswith("javascript:") for url in urls), urls
    content.locator("a").click()
    page.wait_for_timeout(200)
    assert page.evaluate("window.__pwned") is None
    assert len(page.context.pages) == 1


def test_a_model_is_deleted_from_the_models_page_and_the_cli_agrees(
    scripted_ui: str, page: Page, tmp_path: Path
) -> None:
    page.goto(f"{scripted_ui}/#/models")
    tiny = page.locator('#models-available tr[data-model="tiny"]')
    expect(tiny).to_have_count(1)
    # The first confirm dialog is dismissed, the others accepted. Requests leave in the order
    # the clicks send them, so one DELETE in all means the dismissed click sent none.
    answers = iter([False, True, True])
    asked: list[str] = []
    sent: list[str] = []

    def answer(dialog: Dialog) -> None:
        asked.append(dialog.message)
        if next(answers):
            dialog.accept()
        else:
            dialog.dismiss()

    page.on("dialog", answer)
    page.on(
        "request", lambda request: sent.append(request.url) if request.method == "DELETE" else None
    )
    tiny.get_by_role("button", name="Delete").click()
    tiny.get_by_role("button", name="Delete").click()
    expect(tiny).to_have_count(0)
    assert len(asked) == 2 and "tiny" in asked[0]
    assert sent == [f"{scripted_ui}/v1/kronk/models/tiny"]
    assert not (tmp_path / "models" / "tiny.gguf").exists()
    served = [model["id"] for model in httpx.get(f"{scripted_ui}/v1/models").json()["data"]]
    assert "tiny" not in served and MARKDOWN_MODEL in served
    listed = kronk_at(tmp_path, "model", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "tiny" not in [entry["id"] for entry in json.loads(listed.stdout)]

    # A model Kronk did not put under <base>/models is refused, and the page says why.
    page.locator(f'#models-available tr[data-model="{MARKDOWN_MODEL}"] button').click()
    expect(page.locator("#banner")).to_contain_text("which is not under")
    expect(page.locator(f'#models-available tr[data-model="{MARKDOWN_MODEL}"]')).to_have_count(1)


def test_chat_streams_an_answer_and_a_catalog_pull_reaches_100_percent(
    ui_server: tuple[str, FileServer], page: Page, screenshots: Path, tiny_llama_path: Path
) -> None:
    base_url, hub = ui_server
    page.goto(f"{base_url}/#/chat")
    page.select_option("#chat-model", DEFAULT_MODEL_ID)
    page.fill("#chat-system", "You are a poet.")
    page.fill("#chat-max-tokens", "40")
    page.fill("#chat-temperature", "0")
    page.fill("#chat-text", "Write one line about the sea.")
    page.click("#chat-send")
    answer = page.locator('.msg.assistant[data-done="true"]')
    expect(answer).to_have_count(1, timeout=60_000)
    assert answer.locator(".content").inner_text().strip()
    expect(answer.locator(".meta")).to_contain_text("completion tokens")
    # Time to the first token and the pace after it, as the browser saw them.
    expect(answer.locator(".meta")).to_contain_text("TTFT")
    expect(answer.locator(".meta")).to_contain_text("tokens/s")
    assert float(answer.get_attribute("data-ttft") or 0) > 0
    assert float(answer.get_attribute("data-tokens-per-second") or 0) > 0
    expect(page.locator(".msg.user .content")).to_have_text("Write one line about the sea.")
    assert answer.locator("details.reasoning").is_hidden()
    shoot(page, screenshots, "chat")

    # Reasoning is shown apart from the answer, and "Show reasoning" folds it away.
    page.click("#chat-clear")
    page.select_option("#chat-model", THINKING_MODEL)
    page.fill("#chat-max-tokens", "12")
    page.fill("#chat-text", "Why is the sky blue?")
    page.click("#chat-send")
    expect(answer).to_have_count(1, timeout=60_000)
    reasoning = answer.locator("details.reasoning")
    expect(reasoning).to_be_visible()
    # Open, so the reasoning is read as it streams; its summary folds it.
    expect(reasoning.locator(".text")).to_be_visible()
    assert reasoning.locator(".text").inner_text().strip()
    expect(answer.locator(".content")).to_have_text("")
    shoot(page, screenshots, "chat-reasoning")
    page.uncheck("#chat-show-reasoning")
    expect(reasoning).to_be_hidden()
    page.check("#chat-show-reasoning")

    size = tiny_llama_path.stat().st_size
    served = hub.routes[TINY_PATH] = Served(path=tiny_llama_path, pause_after=size // 2)
    page.goto(f"{base_url}/#/catalog")
    row = page.locator('#catalog-models tr[data-model="tiny-chat"]')
    row.get_by_role("button", name="Pull").click()
    pull = page.locator('#pulls .pull[data-model="tiny-chat"]')
    expect(pull).to_have_attribute("data-status", "running")
    assert served.paused.wait(30)
    expect(pull.locator(".percent")).to_have_text("50.0%", timeout=10_000)
    shoot(page, screenshots, "catalog-pulling")
    served.go.set()
    expect(pull).to_have_attribute("data-status", "done", timeout=30_000)
    expect(pull.locator(".percent")).to_have_text("100%")
    expect(row.locator(".pill")).to_have_text("yes")
    shoot(page, screenshots, "catalog")

    page.goto(f"{base_url}/#/dashboard")
    expect(page.locator("#dash-loaded")).to_have_text("2")
    expect(page.locator("#dash-slots tr")).to_have_count(2)
    # The live charts follow the engines: a chat that runs after their first read shows as
    # tokens per second, then as a time to first token once it finishes.
    requests_chart = page.locator("#dash-chart-requests")
    expect(requests_chart).to_have_attribute("data-points", re.compile(r"[1-9]"), timeout=10_000)
    count = "Count from 1 to 100, separated by commas."
    body = {"model": DEFAULT_MODEL_ID, "messages": [{"role": "user", "content": count}]}
    body |= {"max_tokens": 64, "temperature": 0}
    running = threading.Thread(
        target=httpx.post,
        args=(f"{base_url}/v1/chat/completions",),
        kwargs={"json": body, "timeout": 120},
    )
    running.start()
    tokens_chart = page.locator("#dash-chart-tokens")
    expect(tokens_chart).to_have_attribute("data-points", re.compile(r"[1-9]"), timeout=10_000)
    page.wait_for_function(
        "() => Number(document.getElementById('dash-live-tps').textContent) > 0", timeout=30_000
    )
    running.join()
    page.wait_for_function(
        "() => Number(document.getElementById('dash-live-ttft').textContent) > 0", timeout=30_000
    )
    expect(page.locator("#dash-live-slots")).to_have_text("0 / 2")
    for chart in ("tokens", "ttft", "requests", "slots"):
        points = page.locator(f"#dash-chart-{chart}").get_attribute("data-points")
        assert int(points or 0) >= 1, chart
    shoot(page, screenshots, "dashboard")
    page.goto(f"{base_url}/#/models")
    expect(page.locator(f'#models-loaded tr[data-model="{DEFAULT_MODEL_ID}"]')).to_have_count(1)
    expect(page.locator(f'#models-available tr[data-model="{THINKING_MODEL}"]')).to_have_count(1)
    shoot(page, screenshots, "models")
    for model in (DEFAULT_MODEL_ID, THINKING_MODEL):
        page.locator(f'#models-loaded tr[data-model="{model}"] button').click()
        expect(page.locator(f'#models-loaded tr[data-model="{model}"]')).to_have_count(0)
    expect(page.locator("#models-loaded")).to_contain_text("No model is loaded")


def test_with_auth_on_a_token_is_created_from_the_admin_token_in_settings(
    tmp_path: Path, page: Page, screenshots: Path, serve: Any
) -> None:
    models = {GEMMA_MODEL_ID: parse_model_config(GEMMA_MODEL_ID, SMALL)}
    kronk = Kronk(KronkConfig(base_path=tmp_path, models=models))
    settings = ServerSettings(base_path=tmp_path, sections={"auth-jwt": {"enabled": True}})
    with serve(create_app(settings, kronk=kronk)) as base_url:
        admin = (tmp_path / "keys" / "master.jwt").read_text().strip()
        page.goto(f"{base_url}/#/models")
        expect(page.locator("#banner")).to_contain_text("enter a token in Settings")
        page.goto(f"{base_url}/#/settings")
        page.fill("#settings-token", admin)
        page.click("#settings-form button[type=submit]")
        expect(page.locator("#token-state")).to_have_text("token set")
        shoot(page, screenshots, "settings")
        page.goto(f"{base_url}/#/security")
        expect(page.locator('#keys tr[data-key="master"]')).to_have_count(1)
        page.fill("#token-endpoints", "chat-completions:10/day")
        page.fill("#token-duration", "1h")
        page.click("#token-form button[type=submit]")
        expect(page.locator("#token-result")).to_be_visible()
        token = page.input_value("#token-value")
        shoot(page, screenshots, "security")
        user = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{base_url}/v1/models", headers=user).status_code == 200
        assert httpx.get(f"{base_url}/v1/kronk/models", headers=user).status_code == 403
        # The token stays in the browser: nothing of it was written under the base path.
        stored = [path for path in tmp_path.rglob("*") if path.is_file()]
        assert all(token not in path.read_text(errors="ignore") for path in stored)


def test_libraries_and_documentation_pages(
    ui_server: tuple[str, FileServer], page: Page, screenshots: Path
) -> None:
    """The Libraries page shows what /v1/kronk/libs says; the Documentation page lists every
    command and SDK method, read from the code, and filters them."""
    base_url, _ = ui_server
    libs = httpx.get(f"{base_url}/v1/kronk/libs").json()
    page.goto(f"{base_url}/#/libraries")
    expect(page.locator("#libs-version")).to_have_text(libs["current"])
    expect(page.locator("#libs-directory")).to_have_text(libs["directory"])
    if libs["installed"]:
        expect(page.locator("#libs-installed tr[data-processor]")).to_have_count(
            len(libs["installed"])
        )
    else:
        expect(page.locator("#libs-installed")).to_contain_text("No build of `kronk libs`")
    shoot(page, screenshots, "libraries")

    page.goto(f"{base_url}/#/docs")
    commands = page.locator("#docs-cli details.entry")
    expect(commands.first).to_be_visible()
    titles = commands.locator("summary code").all_inner_texts()
    assert "kronk server start" in titles and "kronk model pull REFERENCE" in titles
    methods = page.locator("#docs-sdk summary code").all_inner_texts()
    assert any(title.startswith("await kronk.chat(messages") for title in methods)
    assert any(title.startswith("kronk.models.ids()") for title in methods)
    start = page.locator('#docs-cli details.entry[data-title="kronk server start"]')
    start.locator("summary").click()
    expect(start).to_contain_text("--api-host")
    page.fill("#docs-filter", "model pull")
    pull = page.locator('#docs-cli details.entry[data-title="kronk model pull reference"]')
    expect(pull).to_be_visible()
    expect(start).to_be_hidden()
    shoot(page, screenshots, "docs")
