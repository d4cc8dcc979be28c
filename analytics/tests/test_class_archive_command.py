"""`manage.py spark_class_archive`: `--if-missing` leaves a written archive alone; a failed write says so."""

import pytest
from django.core.management import CommandError, call_command

from analytics import class_archive


def test_if_missing_leaves_an_archive_already_written_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = class_archive.archive_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archived")

    call_command("spark_class_archive", "--if-missing")

    # A write would have started the warm-up's JVM and replaced the file with hundreds of MB.
    assert path.read_bytes() == b"archived"
    assert capsys.readouterr().out == f"class archive present: {path}\n"


@pytest.mark.slow
def test_a_write_that_fails_is_a_command_error_and_leaves_no_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # No java there: the warm-up's session cannot start its JVM.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))

    with pytest.raises(CommandError, match="writing the class archive failed: the archiving JVM failed"):
        call_command("spark_class_archive", "--if-missing")

    assert not class_archive.archive_path().exists()
    assert list(class_archive.archive_path().parent.iterdir()) == []  # nor a half-written temporary file
