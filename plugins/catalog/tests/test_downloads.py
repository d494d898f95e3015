"""Model downloads from a local HTTP server serving real GGUF files: resume, checksums,
split models, the Hugging Face token, disk limits, two pulls at once; the pulled model
then loads and answers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kronk_api.cli import main
from kronk_catalog.download import ChecksumError, Downloader, FileSpec, PullError
from kronk_catalog.pulls import Pull
from kronk_core import Kronk, KronkConfig
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, GEMMA_MODEL_ID
from kronk_testing.file_server import FileServer, Served
from kronk_testing.pulls import leftovers, sha256


def pull(base: Path, *arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*arguments, "--base-path", str(base)])
    return result.exit_code, result.output


def pull_command(url: str) -> list[str]:
    """`kronk model pull URL` as its own process (for signals, locks and resource limits)."""
    return [sys.executable, "-m", "kronk_api.cli", "model", "pull", url]


def answers(base: Path, model_id: str) -> str:
    async def chat() -> str:
        with Kronk(KronkConfig(base_path=base)) as kronk:
            assert model_id in kronk.models.ids()
            result = await kronk.chat(
                [{"role": "user", "content": "hi"}], model=model_id, max_tokens=4
            )
            return result.content

    return asyncio.run(chat())


def test_a_dropped_connection_resumes_and_the_model_answers(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    with FileServer() as server:
        size = tiny_llama_path.stat().st_size
        server.routes["/files/tiny-llama.gguf"] = Served(path=tiny_llama_path, drop_after=size // 2)
        code, output = pull(tmp_path, "model", "pull", f"{server.url}/files/tiny-llama.gguf")
        assert code == 0, output
        gets = server.gets("/files/tiny-llama.gguf")
    assert [request.headers.get("range") for request in gets] == [None, f"bytes={size // 2}-"]
    assert gets[1].headers["if-range"].startswith('"')
    pulled = tmp_path / "models" / "127.0.0.1" / "tiny-llama.gguf"
    assert sha256(pulled) == sha256(tiny_llama_path)
    assert leftovers(tmp_path) == ["127.0.0.1/tiny-llama.gguf"]
    assert "pulled tiny-llama" in output
    # The progress bar's last state: the whole file, in bytes.
    mib = f"{size / (1 << 20):.1f}"
    assert re.search(rf"tiny-llama ━+ {re.escape(mib)}/{re.escape(mib)} MiB", output), output
    assert answers(tmp_path, "tiny-llama")


async def test_an_interrupted_pull_resumes_where_it_stopped(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    size = tiny_llama_path.stat().st_size
    dest = tmp_path / "models" / "tiny.gguf"
    with FileServer() as server:
        server.routes["/tiny.gguf"] = Served(path=tiny_llama_path, drop_after=size // 3)
        spec = FileSpec(url=f"{server.url}/tiny.gguf", dest=dest, sha256=sha256(tiny_llama_path))
        with pytest.raises(PullError, match="failed after 1 tries"):
            await Downloader(hf_endpoint=server.url, retries=0).fetch(spec, lambda *_: None)
        # Nothing where a model is expected; what came is kept for the next pull.
        assert not dest.exists()
        assert (tmp_path / "models" / "tiny.gguf.partial").stat().st_size == size // 3
        seen: list[int] = []
        await Downloader(hf_endpoint=server.url).fetch(spec, lambda done, total: seen.append(done))
        assert server.gets("/tiny.gguf")[-1].headers["range"] == f"bytes={size // 3}-"
    assert seen[0] == size // 3 and seen[-1] == size
    assert sha256(dest) == spec.sha256
    assert leftovers(tmp_path) == ["tiny.gguf"]


async def test_a_stalled_server_times_out_and_the_pull_resumes(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """A server that stops sending mid-file: each try ends at the read timeout and the next
    resumes from there; past the retries the pull fails, and the next pull finishes it.

    The timeout only has to outlast a pause on the loopback while the server sends what comes
    before its stall (milliseconds); it is generous so that no busy moment cuts a try short.
    """
    size = tiny_llama_path.stat().st_size
    dest = tmp_path / "tiny.gguf"
    with FileServer() as server:
        served = server.routes["/tiny.gguf"] = Served(path=tiny_llama_path, pause_after=size // 4)
        spec = FileSpec(url=f"{server.url}/tiny.gguf", dest=dest, sha256=sha256(tiny_llama_path))
        slow = Downloader(hf_endpoint=server.url, read_timeout=3.0, retries=1)
        with pytest.raises(PullError, match="failed after 2 tries"):
            await slow.fetch(spec, lambda *_: None)
        assert not dest.exists()
        assert (tmp_path / "tiny.gguf.partial").stat().st_size == 2 * (size // 4)
        served.pause_after = None
        served.go.set()
        await Downloader(hf_endpoint=server.url).fetch(spec, lambda *_: None)
        ranges = [request.headers.get("range") for request in server.gets("/tiny.gguf")]
    assert ranges == [None, f"bytes={size // 4}-", f"bytes={2 * (size // 4)}-"]
    assert sha256(dest) == spec.sha256
    assert [path.name for path in tmp_path.iterdir()] == ["tiny.gguf"]


async def test_a_server_without_ranges_starts_over(tmp_path: Path, tiny_llama_path: Path) -> None:
    size = tiny_llama_path.stat().st_size
    with FileServer() as server:
        server.routes["/tiny.gguf"] = Served(
            path=tiny_llama_path, drop_after=size // 2, ranges=False
        )
        spec = FileSpec(url=f"{server.url}/tiny.gguf", dest=tmp_path / "tiny.gguf")
        await Downloader(hf_endpoint=server.url).fetch(spec, lambda *_: None)
        assert len(server.gets("/tiny.gguf")) == 2
    assert sha256(spec.dest) == sha256(tiny_llama_path)


def test_a_wrong_checksum_leaves_nothing(tmp_path: Path, tiny_llama_path: Path) -> None:
    catalogs = tmp_path / "catalogs"
    catalogs.mkdir()
    with FileServer() as server:
        server.routes["/org/tiny-GGUF/resolve/main/tiny.gguf"] = Served(path=tiny_llama_path)
        (catalogs / "mine.yaml").write_text(
            "catalog: mine\nmodels:\n"
            "  - id: tiny-wrong\n    category: Text-Generation\n"
            "    files:\n      models:\n        - url: org/tiny-GGUF/tiny.gguf\n"
            f"          sha256: {'0' * 64}\n",
            encoding="utf-8",
        )
        code, output = pull(
            tmp_path, "catalog", "pull", "tiny-wrong", "--catalog-hf-endpoint", server.url
        )
    assert code == 1
    assert f"sha256 is {sha256(tiny_llama_path)}, expected {'0' * 64}" in output
    assert "the download was discarded" in output
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("served", "words"),
    [
        (None, "404 Not Found"),
        (Served(data=b"<!doctype html><html>a model page</html>"), "is not a GGUF file"),
    ],
)
def test_a_missing_file_or_not_a_gguf_is_a_clear_error(
    tmp_path: Path, served: Served | None, words: str
) -> None:
    with FileServer() as server:
        if served is not None:
            server.routes["/m.gguf"] = served
        code, output = pull(tmp_path, "model", "pull", f"{server.url}/m.gguf")
    assert code == 1 and words in output, output
    assert not (tmp_path / "models").exists() or leftovers(tmp_path) == []


def test_a_split_model_comes_in_all_its_parts_and_answers(
    tmp_path: Path, tiny_split_paths: list[Path]
) -> None:
    with FileServer() as server:
        for part in tiny_split_paths:
            server.routes[f"/split/{part.name}"] = Served(path=part)
        code, output = pull(
            tmp_path, "model", "pull", f"{server.url}/split/{tiny_split_paths[0].name}"
        )
        assert code == 0, output
        assert [request.path for request in server.requests] == [
            f"/split/{part.name}" for part in tiny_split_paths
        ]
    assert leftovers(tmp_path) == [f"127.0.0.1/{part.name}" for part in tiny_split_paths]
    assert answers(tmp_path, "tiny-split")


async def test_the_hugging_face_token_goes_to_the_hub_only(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """The Hub redirects to a CDN on another host: the token must not follow. The sha256
    the Hub gives (X-Linked-Etag) is checked."""
    digest = sha256(tiny_llama_path)
    with FileServer() as hub, FileServer() as cdn:
        cdn.routes["/blob/tiny"] = Served(path=tiny_llama_path)
        cdn.routes["/blob/other"] = Served(data=b"GGUF and then something else")
        for name, target, linked in (("tiny", "tiny", digest), ("bad", "other", digest)):
            hub.routes[f"/org/repo/resolve/main/{name}.gguf"] = Served(
                redirect=f"http://localhost:{cdn.port}/blob/{target}",
                headers={"X-Linked-Etag": f'"{linked}"'},
            )
        downloader = Downloader(hf_endpoint=hub.url, hf_token="hf_secret")
        good = FileSpec(url=f"{hub.url}/org/repo/resolve/main/tiny.gguf", dest=tmp_path / "t.gguf")
        await downloader.fetch(good, lambda *_: None)
        bad = FileSpec(url=f"{hub.url}/org/repo/resolve/main/bad.gguf", dest=tmp_path / "b.gguf")
        with pytest.raises(ChecksumError):
            await downloader.fetch(bad, lambda *_: None)
        assert {request.headers.get("authorization") for request in hub.requests} == {
            "Bearer hf_secret"
        }
        assert all("authorization" not in request.headers for request in cdn.requests)
        assert len(cdn.requests) == 2
    assert sha256(good.dest) == digest and not bad.dest.exists()


async def test_two_pulls_of_one_file_share_one_download(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    size = tiny_llama_path.stat().st_size
    with FileServer() as server:
        served = server.routes["/tiny.gguf"] = Served(path=tiny_llama_path, pause_after=size // 2)
        downloader = Downloader(hf_endpoint=server.url)
        spec = FileSpec(url=f"{server.url}/tiny.gguf", dest=tmp_path / "tiny.gguf")
        first: list[int] = []
        second: list[int] = []
        one = asyncio.ensure_future(downloader.fetch(spec, lambda done, total: first.append(done)))
        await asyncio.to_thread(served.paused.wait, 30)
        two = asyncio.ensure_future(downloader.fetch(spec, lambda done, total: second.append(done)))
        await asyncio.sleep(0)  # let the second pull join before the server goes on
        served.go.set()
        await asyncio.gather(one, two)
        assert len(server.gets("/tiny.gguf")) == 1
    assert first[-1] == second[-1] == size
    assert sha256(spec.dest) == sha256(tiny_llama_path)
    # Pulled once, a file is not fetched again.
    await Downloader(hf_endpoint="http://127.0.0.1:9").fetch(spec, lambda *_: None)


async def test_a_watcher_holding_a_snapshot_while_the_pull_ends_still_gets_the_final_one(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    # CI once saw a pull's events end on `progress` at 100% with no `done`: the pull
    # ended between the watcher's last snapshot and its next look.
    spec = FileSpec(url="http://127.0.0.1:9/tiny.gguf", dest=tmp_path / "tiny.gguf")
    shutil.copyfile(tiny_llama_path, spec.dest)  # already there: the pull ends at once
    pull = Pull(model="tiny", files=[spec], kind="catalog")
    watcher = pull.watch()
    assert (await anext(watcher))["status"] == "running"
    await pull.run(Downloader(hf_endpoint="http://127.0.0.1:9"))
    last = await anext(watcher)
    assert (last["status"], last["percent"]) == ("done", 100.0)
    with pytest.raises(StopAsyncIteration):
        await anext(watcher)


def test_two_processes_pulling_one_file_download_it_once(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """Two `kronk model pull` commands at once: the second waits for the first (a lock file
    beside the download), says so, and then finds the file done."""
    size = tiny_llama_path.stat().st_size
    environment = {**os.environ, "KRONK_BASE_PATH": str(tmp_path)}
    with FileServer() as server:
        served = server.routes["/tiny.gguf"] = Served(path=tiny_llama_path, pause_after=size // 2)
        command = pull_command(f"{server.url}/tiny.gguf")
        first_log = tmp_path / "first.log"
        with first_log.open("w") as log:
            first = subprocess.Popen(command, env=environment, stdout=log, stderr=log)
        assert served.paused.wait(60)
        second = subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True)
        assert second.stderr is not None
        said = ""
        for said in second.stderr:  # whatever it prints first, up to its reason to wait
            if "another process" in said:
                break
        served.go.set()
        rest = second.stderr.read()
        assert (first.wait(60), second.wait(60)) == (0, 0), first_log.read_text() + rest
        assert said == "tiny.gguf is being downloaded by another process; waiting for it\n"
        assert len(server.gets("/tiny.gguf")) == 1
    assert leftovers(tmp_path) == ["127.0.0.1/tiny.gguf"]
    assert sha256(tmp_path / "models" / "127.0.0.1" / "tiny.gguf") == sha256(tiny_llama_path)


def test_ctrl_c_stops_a_pull_and_the_same_command_resumes_it(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    size = tiny_llama_path.stat().st_size
    environment = {**os.environ, "KRONK_BASE_PATH": str(tmp_path)}
    dest = tmp_path / "models" / "127.0.0.1" / "tiny.gguf"
    with FileServer() as server:
        served = server.routes["/tiny.gguf"] = Served(path=tiny_llama_path, pause_after=size // 2)
        command = pull_command(f"{server.url}/tiny.gguf")
        first = subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True)
        assert served.paused.wait(60)
        first.send_signal(signal.SIGINT)
        _, said = first.communicate(timeout=60)
        assert first.returncode == 1, said
        assert "Error: interrupted; the same command resumes where this one stopped" in said
        # What came is kept beside the model's place, which stays empty.
        kept = dest.with_name("tiny.gguf.partial").stat().st_size
        assert kept <= size // 2 and not dest.exists()
        served.pause_after = None
        served.go.set()
        second = subprocess.run(command, env=environment, capture_output=True, text=True)
        assert second.returncode == 0, second.stderr
        resumed = server.gets("/tiny.gguf")[-1].headers.get("range")
    assert resumed == (f"bytes={kept}-" if kept else None)
    assert sha256(dest) == sha256(tiny_llama_path)
    assert leftovers(tmp_path) == ["127.0.0.1/tiny.gguf"]


def test_the_hf_token_from_the_environment_goes_to_the_hub_only(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """`kronk model pull` reads the manual's KRONK_HF_TOKEN; a redirect off the Hub drops it."""
    with FileServer() as hub, FileServer() as cdn:
        cdn.routes["/blob/tiny"] = Served(path=tiny_llama_path)
        hub.routes["/org/repo/resolve/main/tiny.gguf"] = Served(
            redirect=f"http://localhost:{cdn.port}/blob/tiny"
        )
        result = CliRunner().invoke(
            main,
            ["model", "pull", "org/repo/tiny.gguf", "--catalog-hf-endpoint", hub.url],
            env={"KRONK_HF_TOKEN": "hf_from_env", "KRONK_BASE_PATH": str(tmp_path)},
        )
        assert result.exit_code == 0, result.output
        assert [request.headers.get("authorization") for request in hub.requests] == [
            "Bearer hf_from_env"
        ]
        assert [request.headers.get("authorization") for request in cdn.requests] == [None]
    assert leftovers(tmp_path) == ["org/repo/tiny.gguf"]


def test_no_room_on_the_disk_is_found_before_downloading(tmp_path: Path) -> None:
    with FileServer() as server:
        server.routes["/huge.gguf"] = Served(claimed_size=1 << 60)
        code, output = pull(tmp_path, "model", "pull", f"{server.url}/huge.gguf")
    assert code == 1 and "not enough disk space for huge.gguf" in output, output
    assert leftovers(tmp_path) == []


def test_a_disk_that_fills_up_leaves_no_partial_file(tmp_path: Path, tiny_llama_path: Path) -> None:
    """The pull runs with a file-size limit (RLIMIT_FSIZE): its writes fail as on a full disk."""
    kept = tmp_path / "models" / "127.0.0.1" / "kept.gguf"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"GGUF already pulled")

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))

    with FileServer() as server:
        server.routes["/tiny.gguf"] = Served(path=tiny_llama_path)
        completed = subprocess.run(
            pull_command(f"{server.url}/tiny.gguf"),
            env={**os.environ, "KRONK_BASE_PATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=limit,
        )
    assert completed.returncode == 1, completed.stderr
    assert "no room left to write tiny.gguf: File too large" in completed.stderr
    assert leftovers(tmp_path) == ["127.0.0.1/kept.gguf"]
    assert kept.read_bytes() == b"GGUF already pulled"


def test_a_projector_comes_beside_its_model_and_is_not_a_model(
    tmp_path: Path, tiny_llama_path: Path, reranker_path: Path
) -> None:
    """A GGUF stands in for the projector: the downloader treats every file alike."""
    with FileServer() as hub:
        hub.routes["/org/vl-GGUF/resolve/main/vl.gguf"] = Served(path=tiny_llama_path)
        hub.routes["/org/vl-GGUF/resolve/main/mmproj-F16.gguf"] = Served(path=reranker_path)
        code, output = pull(
            tmp_path,
            "model",
            "pull",
            "org/vl-GGUF/vl.gguf",
            "--proj",
            "org/vl-GGUF/mmproj-F16.gguf",
            "--catalog-hf-endpoint",
            hub.url,
        )
    assert code == 0, output
    assert leftovers(tmp_path) == ["org/vl-GGUF/mmproj-F16.gguf", "org/vl-GGUF/vl.gguf"]
    code, output = pull(tmp_path, "model", "list", "--json")
    listed = [entry["id"] for entry in json.loads(output)]
    assert listed == ["vl", DEFAULT_MODEL_ID, GEMMA_MODEL_ID]
