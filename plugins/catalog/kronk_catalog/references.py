"""Models by the names people give them: a Hugging Face repository and a quantization.

`org/repo`, `org/repo:Q4_K_M`, Ollama's `hf.co/org/repo:Q4_K_M` and a repo's page
URL (`https://huggingface.co/org/repo`) name a repository; its files are picked
as llama-server's `-hf` picks them: the GGUF of the named quantization (Q4_K_M
when none is named, else the repo's first model file), every part of a split
one, and a projector (mmproj) beside it. The same picking finds a pulled model
on disk, so a reference works as a model id once pulled, without the network.
A file reference (`org/repo/file.gguf`, a file URL) is not a repo reference.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from kronk_core.contract import ModelNotFoundError
from kronk_llamacpp.files import PROJECTOR_MARK

# What llama-server's -hf takes when no quantization is named.
DEFAULT_QUANT = "Q4_K_M"
# Ollama's tag for "the default"; any case.
LATEST = "latest"
# Hosts whose page URLs name a repository, besides the configured Hub's.
HUB_HOSTS = ("huggingface.co", "hf.co")
# Projectors, from the least lossy: the one a quantization names wins over these.
PROJECTOR_PREFERENCE = ("f16", "bf16", "f32", "q8_0")

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?::(?P<quant>[A-Za-z0-9._-]+))?$")
_SPLIT = re.compile(r"-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)


@dataclass(frozen=True)
class RepoReference:
    """A repository on the Hub and the quantization wanted from it (None: the default)."""

    repo_id: str
    quant: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}:{self.quant}" if self.quant else self.repo_id


def parse_reference(text: str, hub_endpoint: str) -> RepoReference | None:
    """The repository `text` names, or None when it names a file or is no reference at all."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        url = urlsplit(text)
        hosts = {*HUB_HOSTS, urlsplit(hub_endpoint).netloc}
        if url.netloc not in hosts and url.netloc.removeprefix("www.") not in hosts:
            return None
        text = unquote(url.path).strip("/")
    found = _REPO.match(without_hub_host(text))
    if found is None or found["repo"].lower().endswith(".gguf"):
        return None
    quant = found["quant"]
    return RepoReference(found["repo"], None if quant is None or quant.lower() == LATEST else quant)


def without_hub_host(text: str) -> str:
    """`hf.co/org/repo...` (Ollama's spelling, no scheme) as `org/repo...`."""
    for host in HUB_HOSTS:
        if text.startswith(f"{host}/"):
            return text[len(host) + 1 :]
    return text


def is_projector(path: str) -> bool:
    return PROJECTOR_MARK in PurePosixPath(path).name.lower()


def _is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def _first_part(path: str) -> bool:
    split = _SPLIT.search(path)
    return split is None or int(split["part"]) == 1


def names_quant(path: str, quant: str) -> bool:
    """Whether a file's path names `quant` (any case) as a word of its own: Q4_K matches
    `m-Q4_K.gguf` and a folder `Q4_K/`, not `m-Q4_K_M.gguf` or `m-IQ4_K.gguf`."""
    pattern = rf"(?:^|(?<=[-._/])){re.escape(quant)}(?=[-./]|$)"
    return re.search(pattern, path, re.I) is not None


def split_parts(first: str, paths: Iterable[str]) -> list[str]:
    """Every part of the split model whose first part is `first` (just `first` if not split);
    ModelNotFoundError when the listing lacks one."""
    split = _SPLIT.search(first)
    if split is None:
        return [first]
    count = int(split["count"])
    head = first[: split.start()]
    wanted = [f"{head}-{number:05d}-of-{split['count']}.gguf" for number in range(1, count + 1)]
    present = {path.lower(): path for path in paths}
    missing = [name for name in wanted if name.lower() not in present]
    if missing:
        raise ModelNotFoundError(
            f"{first} is split in {count} parts, but {', '.join(missing)} is missing", param="model"
        )
    return [present[name.lower()] for name in wanted]


def pick_model(reference: RepoReference, paths: Sequence[str]) -> list[str]:
    """The model's files among a repository's paths (all parts of a split one, in order).

    ModelNotFoundError, naming the files there are, when no model file fits.
    """
    models = sorted(p for p in paths if _is_gguf(p) and not is_projector(p))
    firsts = [path for path in models if _first_part(path)]
    if reference.quant is not None:
        found = [path for path in firsts if names_quant(path, reference.quant)]
    else:
        found = [path for path in firsts if names_quant(path, DEFAULT_QUANT)] or firsts
    if not found:
        what = f"no {reference.quant} GGUF file" if reference.quant else "no GGUF model file"
        listed = ", ".join(PurePosixPath(path).name for path in firsts[:12]) or "none"
        raise ModelNotFoundError(
            f"{reference.repo_id} has {what} (its GGUF models: {listed})", param="model"
        )
    # Several files may name the quantization (`m-Q4_K_M.gguf`, `m-UD-Q4_K_M.gguf`): the
    # plainest name is the one people mean.
    first = min(found, key=lambda path: (len(path), path))
    return split_parts(first, paths)


def pick_projector(model: str, paths: Sequence[str]) -> str | None:
    """The projector beside `model`, if its repository has one: in the model's folder (else
    anywhere), one that names the model's quantization, else the least lossy."""
    projectors = sorted(p for p in paths if _is_gguf(p) and is_projector(p))
    folder = str(PurePosixPath(model).parent)
    near = [p for p in projectors if str(PurePosixPath(p).parent) == folder] or projectors
    if not near:
        return None
    for quant in (*_quants_named(model), *PROJECTOR_PREFERENCE):
        for path in near:
            if names_quant(path, quant):
                return path
    return near[0]


def _quants_named(path: str) -> list[str]:
    """Quantization-like words of a model's file name (`Q4_K_M`, `F16`), longest first."""
    stem = _SPLIT.sub("", PurePosixPath(path).name)
    words = re.findall(r"(?i)(?<![A-Za-z0-9])((?:I?Q\d\w*?)|B?F\d+)(?=[-.]|$)", stem)
    return sorted(set(words), key=len, reverse=True)


def local_model(reference: RepoReference, models_dir: Path) -> Path | None:
    """The pulled model `reference` names, under `<base>/models/org/repo/`, or None."""
    repo_dir = models_dir / reference.repo_id
    if not repo_dir.is_dir():
        return None
    paths = [path.relative_to(repo_dir).as_posix() for path in repo_dir.rglob("*.gguf")]
    try:
        first = pick_model(reference, paths)[0]
    except ModelNotFoundError:
        return None
    return repo_dir / first
