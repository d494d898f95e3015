"""Vendor the browser UI's Markdown renderer and sanitizer from the npm registry.

The UI loads no code from a CDN: marked (Markdown to HTML) and DOMPurify (the sanitizer the
HTML passes before it reaches the page) are files in plugins/ui/kronk_ui/static/vendor/,
copied byte for byte from the packages' npm tarballs, with each package's license beside
them. This fetches the pinned versions with `npm pack`, refuses a tarball whose integrity is
not the pinned one, copies the files and writes vendor/README.md (versions, integrity, each
file's SHA-256). A new version: change VERSION and INTEGRITY below (`npm view PKG@VERSION
dist.integrity`), run this, and run plugins/ui/tests/test_ui_browser.py.

Usage: python scripts/vendor_ui.py
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[1] / "plugins/ui/kronk_ui/static/vendor"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    integrity: str
    license: str
    # Path in the tarball -> name in vendor/.
    files: dict[str, str]


PACKAGES = [
    Package(
        name="marked",
        version="18.2.1",
        integrity="sha512-ii4bxCTCqqwpT86XZWgJNs+ZnAIZksmLGYMViWA7PDIXYIeNo1x6cDdX3JOip9NM/cI6p8z57FxliACboTruMA==",
        license="MIT",
        files={"package/lib/marked.umd.js": "marked.umd.js", "package/LICENSE": "marked.LICENSE"},
    ),
    Package(
        name="dompurify",
        version="3.5.0",
        integrity="sha512-LYC0ZkE8P1V42JsRYTwMdme/2ET8SpOc5AA2eOFjP/IadvRd2fwiT4TVz5vkfy0XUx12aS2UaRkTnfVPNOv9vw==",
        license="MPL-2.0 OR Apache-2.0",
        files={
            "package/dist/purify.min.js": "purify.min.js",
            "package/LICENSE": "dompurify.LICENSE",
            "package/LICENSE-MPL": "dompurify.LICENSE-MPL",
        },
    ),
]


def fetch(package: Package, into: Path) -> Path:
    """The package's tarball from the registry, checked against its pinned integrity."""
    spec = f"{package.name}@{package.version}"
    packed = subprocess.run(
        ["npm", "pack", spec, "--json", "--pack-destination", str(into)],
        cwd=into,
        capture_output=True,
        text=True,
        check=True,
    )
    (found,) = json.loads(packed.stdout)
    filename: str = found["filename"]
    if found["integrity"] != package.integrity:
        raise SystemExit(
            f"{spec}: the registry's integrity {found['integrity']} is not the pinned one"
        )
    return into / filename


def readme(packages: list[Package]) -> str:
    lines = [
        "# Vendored browser code",
        "",
        "Copied byte for byte from the npm tarballs by `scripts/vendor_ui.py`; do not edit.",
        "The UI serves them from `/ui/vendor/`; nothing is loaded from a CDN.",
        "",
    ]
    for package in packages:
        lines += [
            f"## {package.name} {package.version}",
            "",
            f"- tarball: https://registry.npmjs.org/{package.name}/-/{package.name}-{package.version}.tgz",
            f"- integrity: `{package.integrity}`",
            f"- license: {package.license}",
            "",
        ]
        for name in package.files.values():
            digest = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
            lines.append(f"- `{name}` sha256 `{digest}`")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    VENDOR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for package in PACKAGES:
            with tarfile.open(fetch(package, Path(scratch))) as tarball:
                for member, name in package.files.items():
                    source = tarball.extractfile(member)
                    assert source is not None, f"{package.name}: {member} is not a file"
                    (VENDOR / name).write_bytes(source.read())
    (VENDOR / "README.md").write_text(readme(PACKAGES), encoding="utf-8")
    print(f"vendored {', '.join(f'{p.name} {p.version}' for p in PACKAGES)} into {VENDOR}")


if __name__ == "__main__":
    main()
