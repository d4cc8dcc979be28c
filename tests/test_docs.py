"""The documentation names only files that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A file name inside `code`: a path, or a bare name that the text places in a folder it names nearby.
FILE_NAME = re.compile(r"(?<![\w<>{}$*.-])([\w./-]*\w\.(?:py|sh|md|txt|toml|html))(?![\w/])")


def named_files(text: str) -> set[str]:
    names = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        names.update(name for name in FILE_NAME.findall(span) if "<" not in name)
    return names


def exists(name: str) -> bool:
    if "/" in name:
        return (ROOT / name).exists()
    return any(path for path in ROOT.rglob(name) if ".venv" not in path.parts)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_file_the_documentation_names_exists(document):
    missing = sorted(name for name in named_files(document.read_text()) if not exists(name))
    assert missing == []
