"""The test suite stands on the repository alone: no test reads a file from outside the
checkout, and tests import their shared helpers from the harness, never from each other.

What is scanned: every Python file of the test folders (tests/, plugins/*/tests/, the
example plugin's tests/), of the harness (kronk_testing/) and every conftest.py, parsed
(so comments and docstrings' prose are scanned as the strings they are, and nothing is
run). What fails:

- a string (a plain one, a piece of an f-string, bytes) that starts with a place that exists
  on one machine only: a home or work folder (/work, /home, /root, /Users, ~), a mount
  (/mnt, /media, /srv, /data) or a fixed temporary path (/tmp, /var/tmp) instead of the
  test's own (`tmp_path`); and any string that names the folder beside the checkout where
  the seed documents are (shared/seeds). The operating system's own interfaces and tools
  (/proc, /dev, /usr/bin, /usr/sbin, /etc) are the platform, not data, and are allowed;
- `Path(__file__)` walked up past the checkout's root (`.parents[N]`, `.parent` chains,
  `os.path.dirname` nested);
- a `..` path component in a string used as a path: an argument of Path(), open(),
  os.path.join() or joinpath(), or a side of `/` (a `..` sent as hostile input to the code
  under test, such as a key id, is not a path the test reads);
- an import of a module that lives in a test folder (`from fuzzing import`, `from conftest
  import`, `from test_x import`, a relative import), even one under TYPE_CHECKING: helpers
  that tests share are public modules of kronk_testing.

It cannot see a path built at run time from pieces that are each harmless, or one read
from an environment variable: those are for review. The user's cache folder, where the
harness keeps the models it generates and the libraries it builds, is the code under
test's own choice (kronk_core.settings.model_files.cache_dir), not a path written here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_FOLDERS = [
    ROOT / "tests",
    *sorted(ROOT.glob("plugins/*/tests")),
    *sorted(ROOT.glob("examples/*/tests")),
]
HARNESS = ROOT / "kronk_testing"
# Where a checkout's neighbours live on one machine: never where a test's data may be.
MACHINE_ROOTS = (
    "/work", "/home", "/root", "/Users", "~", "/mnt", "/media", "/srv", "/data", "/tmp",
    "/var/tmp",
)  # fmt: skip
OUTSIDE_NAMES = ("shared/seeds",)
PATH_CALLS = {"Path", "PurePath", "PosixPath", "open", "join", "joinpath"}


def scanned_files() -> list[Path]:
    found = {path for folder in TEST_FOLDERS for path in folder.rglob("*.py")}
    found |= set(HARNESS.rglob("*.py"))
    for conftest in ROOT.rglob("conftest.py"):
        if not any(part.startswith(".") for part in conftest.relative_to(ROOT).parts):
            found.add(conftest)
    found.discard(Path(__file__).resolve())  # its patterns are what it looks for
    return sorted(found)


FILES = scanned_files()
# Every module a test folder holds, by the name an absolute import would give it.
TEST_FOLDER_MODULES = {path.stem for folder in TEST_FOLDERS for path in folder.rglob("*.py")}


def _strings(node: ast.AST) -> Iterator[tuple[int, str]]:
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str | bytes):
            value = child.value
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            yield child.lineno, text


def _machine_path(text: str) -> bool:
    text = text.removeprefix("file://")
    return any(
        text == root or text.startswith(root + "/") or (root == "~" and text.startswith("~"))
        for root in MACHINE_ROOTS
    )


def _levels_up(node: ast.AST) -> int | None:
    """How many folders above its file `node` walks from `Path(__file__)` or `__file__`
    (a file's own folder is one level), or None where it does not start there."""
    if isinstance(node, ast.Name) and node.id == "__file__":
        return 0
    if isinstance(node, ast.Call):
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        if name in {"Path", "PurePath"} and node.args:
            return _levels_up(node.args[0])
        if name == "dirname" and node.args:
            inner = _levels_up(node.args[0])
            return None if inner is None else inner + 1
        if isinstance(function, ast.Attribute) and name in {"resolve", "absolute"}:
            return _levels_up(function.value)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _levels_up(node.value)
        return None if inner is None else inner + 1
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "parents"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        inner = _levels_up(node.value.value)
        return None if inner is None else inner + node.slice.value + 1
    return None


def _dot_dot(text: str) -> bool:
    return ".." in text.replace("\\", "/").split("/")


def _path_strings(node: ast.AST) -> Iterator[tuple[int, str]]:
    """The strings `node` uses as paths: Path(...)/open(...)/join(...) arguments, `/` sides."""
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            function = child.func
            name = (
                function.attr
                if isinstance(function, ast.Attribute)
                else getattr(function, "id", "")
            )
            if name in PATH_CALLS:
                for argument in child.args:
                    yield from _strings(argument)
        elif isinstance(child, ast.BinOp) and isinstance(child.op, ast.Div):
            for side in (child.left, child.right):
                if isinstance(side, ast.Constant | ast.JoinedStr):
                    yield from _strings(side)


def outside_paths(path: Path, source: str | None = None) -> list[str]:
    """What the file at `path` (or `source`, as if it were that file) reads, or may read,
    outside the checkout."""
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, filename=str(path))
    found = [
        f"line {line}: {string[:80]!r}"
        for line, string in _strings(tree)
        if _machine_path(string) or any(name in string for name in OUTSIDE_NAMES)
    ]
    depth = len(path.relative_to(ROOT).parts) - 1  # folders between the root and the file
    for node in ast.walk(tree):
        levels = _levels_up(node)
        if levels is not None and levels > depth + 1:
            found.append(
                f"line {getattr(node, 'lineno', 0)}: {ast.unparse(node)} leaves the checkout"
            )
    found += [
        f"line {line}: {string!r} walks up with '..'"
        for line, string in _path_strings(tree)
        if _dot_dot(string)
    ]
    return found


def imports_from_test_folders(path: Path) -> list[str]:
    """The imports in `path` of a module that lives in a test folder."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.append(f"line {node.lineno}: a relative import ({ast.unparse(node)})")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in TEST_FOLDER_MODULES:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in TEST_FOLDER_MODULES:
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_no_test_reads_outside_the_checkout(path: Path) -> None:
    assert not outside_paths(path), outside_paths(path)


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_tests_import_shared_helpers_from_the_harness_only(path: Path) -> None:
    assert not imports_from_test_folders(path), imports_from_test_folders(path)


def test_the_scan_catches_what_it_is_for(tmp_path: Path) -> None:
    """Each rule, on a source read as if it were a file in tests/ (never written there)."""
    folder = ROOT / "tests"
    cases = {
        'MANUAL = Path("/work/shared/seeds/001.txt")': 1,
        'SEEDS = ROOT / "shared/seeds"': 1,
        'DATA = Path(__file__).resolve().parents[1] / "../shared" / "x.txt"': 1,
        "UP = Path(__file__).resolve().parents[2]": 1,
        "UP = Path(__file__).parent.parent.parent": 1,
        "UP = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))": 1,
        'OPENED = open(f"/home/{USER}/notes.txt")': 1,
        'CACHE = Path("~/.cache/kronk")': 1,
        'FIXED = "/tmp/kronk-test.sock"': 1,
        # Allowed: the checkout's root, the platform, and a `..` that is not a path.
        "ROOT = Path(__file__).resolve().parents[1]": 0,
        'STATM = Path("/proc/self/statm")': 0,
        'keys.delete("../keys/master")': 0,
    }
    for source, expected in cases.items():
        found = outside_paths(folder / "probe.py", source)
        assert len(found) == expected, (source, found)
    imports = {
        "from host_tier_writer import die_while_writing": 1,
        "from conftest import RawFactory": 1,
        "from .test_formats import check_streamed_calls": 1,
        "import test_caching": 1,
        "from kronk_testing.fuzzing import fuzz_settings": 0,
    }
    for source, expected in imports.items():
        written = tmp_path / "probe.py"
        written.write_text(source + "\n", encoding="utf-8")
        assert len(imports_from_test_folders(written)) == expected, source
