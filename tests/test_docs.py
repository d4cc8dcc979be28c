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


def contract_section(title: str) -> str:
    text = (ROOT / "docs" / "CONTRACT.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.django_db
def test_the_contracts_tables_name_columns_the_models_have():
    from django.apps import apps

    tables = {model._meta.db_table: model for model in apps.get_models()}
    entries = re.split(r"(?m)^- ", contract_section("Tables"))[1:]
    assert len(entries) == 3
    for entry in entries:
        table = re.match(r"`(\w+)`", entry).group(1)
        columns = {field.column for field in tables[table]._meta.concrete_fields}
        # The columns are the names in backticks outside parentheses (which hold values and notes).
        named = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", entry.split(":", 1)[1].replace("\n", " "))))
        assert named and named <= columns, (table, named - columns)


def test_the_contracts_queues_and_tasks_are_the_codes():
    from core import contract

    queues = contract_section("Queues")
    for name in (contract.CREDITS_QUEUE, contract.CREDITS_EXPIRED_QUEUE, contract.CREDITS_DEAD_QUEUE):
        assert f"`{name}`" in queues
    for name in (contract.CREDITS_DEAD_EXCHANGE, contract.OUTBOX_QUEUE, contract.ANALYTICS_QUEUE, contract.RELAY_TASK):
        assert f"`{name}`" in queues
    for name in (contract.SWEEP_TASK, contract.PURGE_PUBLISHED_TASK, contract.PURGE_IDEMPOTENCY_KEYS_TASK):
        assert f"`{name}`" in queues
    assert f"`{contract.RUN_NIGHTLY_TASK}`" in queues
    message = contract_section("The message")
    assert f"`{contract.AWARD_CREDITS_TASK}`" in message and f"`{contract.CREATED_AT_HEADER}`" in message
    assert f"`{contract.ORDERED_AT_FIELD}`" in message
