"""Fill in the middle: llama-server's /infill (the request llama.vscode sends) and OpenAI's
completions `suffix`, on the scripted model, whose vocabulary has Qwen2.5-Coder's FIM
tokens and whose answer can show the digest of the very tokens it read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core.contract.backend import FimTokens
from kronk_testing.models.tiny import FIM_TOKEN_IDS
from kronk_testing.plugin import MakeKronk, ScriptedKronk
from kronk_testing.scripted import Script, digest, tokenize
from kronk_testing.server import Serve

PREFIX = "def add(a, b):\n"
SUFFIX = "\n\nprint(add(1, 2))\n"
TYPED = "    ret"
# The model answers what goes in the middle, and the digest of the prompt it read.
SCRIPT = Script(replies=(("<|fim_middle|>", "urn a + b|{tokens}|{digest}"),))
# llama.vscode's request (its ring buffer of other files as input_extra), llama-server's
# tuning fields included.
EDITOR_FIELDS = {
    "n_indent": 4,
    "top_k": 40,
    "top_p": 0.99,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": ["content", "timings/prompt_n", "timings/predicted_n"],
}
OTHER_FILE = {"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}


def layout(prefix: str, suffix: str, typed: str = "", files: str = "") -> str:
    """llama-server's layout, spelled out with the scripted model's FIM tokens."""
    context = f"<|repo_name|>myproject\n{files}<|file_sep|>filename\n"
    return f"<s>{context}<|fim_prefix|>{prefix}{typed}<|fim_suffix|>{suffix}<|fim_middle|>"


def editor_request(n_predict: int) -> dict[str, object]:
    """llama.vscode's /infill body for model `coder`: the code around the cursor, one other
    file, what was typed, llama-server's tuning fields."""
    return {
        "model": "coder",
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [OTHER_FILE],
        "prompt": TYPED,
        "n_predict": n_predict,
        "stream": False,
        **EDITOR_FIELDS,
    }


def answered(text: str, prompt: str) -> None:
    """The answer is the scripted middle, computed on exactly `prompt`'s tokens."""
    tokens = tokenize(prompt)
    assert text == f"urn a + b|{len(tokens)}|{digest(tokens)}"


@pytest.fixture
def base_url(scripted_kronk: ScriptedKronk, serve: Serve, tmp_path: Path) -> Iterator[str]:
    kronk = scripted_kronk(
        {
            "coder": {"script": SCRIPT, "context_window": 1024},
            "small": {"script": SCRIPT, "context_window": 256},
            "prose": {"script": Script(fim=False)},
        }
    )
    with serve(create_app(ServerSettings(base_path=tmp_path), kronk=kronk)) as url:
        yield url


def test_llama_vscode_s_request_is_answered_on_llama_server_s_layout(base_url: str) -> None:
    response = httpx.post(f"{base_url}/infill", json=editor_request(64))
    assert response.status_code == 200, response.text
    answer = response.json()
    files = "<|file_sep|>util.py\ndef sub(a, b):\n    return a - b\n"
    prompt = layout(PREFIX, SUFFIX, TYPED, files)
    answered(answer["content"], prompt)
    assert answer["stop"] is True and answer["stop_type"] == "eos"
    assert answer["tokens_evaluated"] == len(tokenize(prompt))
    assert answer["timings"]["predicted_n"] == answer["tokens_predicted"] > 0


def test_a_streamed_infill_sends_llama_server_s_data_lines(base_url: str) -> None:
    body = {"model": "coder", "input_prefix": PREFIX, "input_suffix": SUFFIX, "stream": True}
    with httpx.stream("POST", f"{base_url}/infill", json=body) as response:
        assert response.status_code == 200
        lines = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")
        ]
    assert all(line["stop"] is False for line in lines[:-1]) and lines[-1]["stop"] is True
    answered("".join(line["content"] for line in lines), layout(PREFIX, SUFFIX))


def test_openai_s_suffix_is_fill_in_the_middle(base_url: str) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(
        model="coder",
        prompt=PREFIX + TYPED,
        suffix=SUFFIX,
        max_tokens=64,
        extra_body={"return_prompt": True},
    )
    prompt = layout(PREFIX + TYPED, SUFFIX)
    answered(completion.choices[0].text, prompt)
    assert completion.model_extra is not None and completion.model_extra["prompt"] == prompt
    streamed = client.completions.create(
        model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=64, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
    answered(text, layout(PREFIX, SUFFIX))


def test_a_long_file_keeps_the_code_nearest_the_cursor(base_url: str) -> None:
    """A 256-token window, 64 for the answer: 192 for the prompt, of which the suffix keeps
    its start (a quarter of what the FIM tokens leave), the prefix its end (the rest); no
    room is left for the other files."""
    before = "".join(f"line {n}\n" for n in range(100))
    after = "".join(f"tail {n}\n" for n in range(100))
    body = {
        "model": "small",
        "input_prefix": before,
        "input_suffix": after,
        "input_extra": [OTHER_FILE],
        "n_predict": 64,
    }
    answer = httpx.post(f"{base_url}/infill", json=body).json()
    code = 192 - 4  # BOS and the three FIM tokens
    kept_before, kept_after = before[len(before) - (code - code // 4) :], after[: code // 4]
    prompt = f"<s><|fim_prefix|>{kept_before}<|fim_suffix|>{kept_after}<|fim_middle|>"
    assert answer["tokens_evaluated"] == 192
    answered(answer["content"], prompt)


def test_an_empty_file_is_filled_too(base_url: str) -> None:
    """The cursor at the start of an empty file: nothing before or after it."""
    empty = {"model": "coder", "input_prefix": "", "input_suffix": ""}
    answer = httpx.post(f"{base_url}/infill", json=empty).json()
    answered(answer["content"], layout("", ""))
    # Both are required, as llama-server requires them.
    missing = httpx.post(f"{base_url}/infill", json={"model": "coder", "input_prefix": ""})
    assert missing.status_code == 400 and "input_suffix" in missing.text


def test_fill_in_the_middle_is_refused_where_it_cannot_be_done(base_url: str) -> None:
    refused = httpx.post(
        f"{base_url}/infill", json={"model": "prose", "input_prefix": "a", "input_suffix": "b"}
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "suffix" and "no fill-in-the-middle tokens" in error["message"]
    ids = httpx.post(
        f"{base_url}/v1/completions", json={"model": "coder", "prompt": [1, 2], "suffix": "b"}
    )
    assert ids.status_code == 400
    assert "suffix: fill in the middle needs the prompt as one text" in ids.text
    wrong = httpx.post(
        f"{base_url}/infill",
        json={"model": "coder", "input_prefix": "", "input_suffix": "", "input_extra": [{"x": 1}]},
    )
    assert wrong.status_code == 400


def test_a_gguf_s_fim_tokens_are_read_and_its_infill_runs_on_llama_cpp(
    tiny_fim_path: Path, make_kronk: MakeKronk, serve: Serve, tmp_path: Path
) -> None:
    """A code model's metadata names its FIM tokens (the tiny model: Gemma's <unused0..4>):
    llama.cpp reads them, and llama.vscode's request runs on the real backend."""
    kronk = make_kronk({"coder": {"model_path": tiny_fim_path, "n_seq_max": 1}}, load="coder")
    loaded = kronk.get_loaded("coder")
    assert loaded is not None
    assert loaded.info.fim == FimTokens(*FIM_TOKEN_IDS)
    body = editor_request(4)

    def count(text: str) -> int:
        return len(loaded.model.tokenize(text, add_special=False, parse_special=False))

    files = 1 + count("myproject\n") + 1 + count("util.py\n") + count(OTHER_FILE["text"])
    files += 1 + count("filename\n")
    code = count(PREFIX) + count(TYPED) + count(SUFFIX)
    # The server closes the model as it stops: counted before.
    with serve(create_app(ServerSettings(base_path=tmp_path), kronk=kronk)) as url:
        answer = httpx.post(f"{url}/infill", json=body).json()
    assert answer["tokens_evaluated"] == 1 + files + 3 + code  # BOS first
    assert answer["tokens_predicted"] == 4 and answer["stop_type"] == "limit"
    assert isinstance(answer["content"], str)
