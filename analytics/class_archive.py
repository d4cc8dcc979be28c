"""The driver JVM's class archive (Java's class data sharing): Spark's classes loaded once, mapped by every run.

A day's run spends a large part of its CPU starting the JVM: loading, parsing and verifying thousands of classes,
each looked up through the 280 jars of Spark's class path. A dynamic CDS archive
(`-XX:ArchiveClassesAtExit`, JDK 13+) keeps them parsed and verified in one file that later JVMs map
(`-XX:SharedArchiveFile`). Starting a session and running one job takes about half the CPU with it
(docs/PERFORMANCE.md, "Nightly analytics").

`manage.py spark_class_archive` writes the archive once (after installing or upgrading pyspark or Java), from a
warm-up job in a process of its own (analytics/warm_up.py); the nightly run maps it when it exists for the Java and
pyspark it runs with, and runs as before when it does not.
A JVM that finds the archive unusable says so on stderr and starts without it, so a stale archive costs only time.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark
from django.conf import settings

ARCHIVE_DIR = "creditshop-spark-classes"
WRITE_OPTION = "-XX:ArchiveClassesAtExit"
USE_OPTION = "-XX:SharedArchiveFile"
# Run as `python -m`, by name: the warm-up imports the job, which imports the session, which imports this module.
WARM_UP_MODULE = "analytics.warm_up"


def archive_path() -> Path:
    """Return where the archive for this Java and this pyspark lives: the user's cache directory, since it belongs
    to the machine's Java and Python environment rather than to a run or a report directory.
    """
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")
    # An archive is only valid for the JVM and class path that wrote it: name it after both.
    jvm = str(java.resolve().parent.parent).strip("/").replace("/", "_")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / ARCHIVE_DIR / f"pyspark-{pyspark.__version__}-{jvm}.jsa"


def archive_option() -> str:
    """Return the driver JVM option that maps the archive, or "" when none has been written."""
    path = archive_path()
    return f" {USE_OPTION}={path}" if path.is_file() else ""


def archive_write(*, timeout: int = 900) -> Path:
    """Run a small representative job in a new JVM that archives the classes it loaded; return the archive's path.

    The JVM writes the archive as it exits, which is after its Python process has ended; waiting for the end of
    its output streams waits for it. It writes to a temporary name, renamed into place once complete, so a run
    starting meanwhile never maps half a file.
    """
    path = archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.unlink(tmp)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", WARM_UP_MODULE, tmp],
            cwd=settings.BASE_DIR,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings")},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if completed.returncode != 0 or not Path(tmp).is_file():
            raise RuntimeError(f"the archiving JVM failed ({completed.returncode}): {completed.stderr[-2000:]}")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path
