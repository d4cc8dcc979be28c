"""A private MariaDB server for tests and the soak: its own data directory and port, started and stopped by pid.

The recipe, from the installed Debian package (mariadb-server), readable as shell:

    mariadb-install-db --no-defaults --datadir=DIR --auth-root-authentication-method=normal --skip-test-db
    mariadbd --no-defaults --datadir=DIR --port=PORT --bind-address=127.0.0.1 --socket=DIR.sock --pid-file=...

`--auth-root-authentication-method=normal` gives root an empty password on 127.0.0.1, like the development
defaults of DATABASE_URL; grants are real (no --skip-grant-tables), so per-process users work as in production.
A fault stops the server as a crash would (SIGKILL) and starts it again on the same data directory: InnoDB
recovers every committed transaction, and clients see refused connections meanwhile.

Each server has a temporary directory of its own (--tmpdir, for install and start alike): a starting mariadbd
deletes every `#sql*` file in its tmpdir, so servers sharing /tmp delete each other's temporary tables, and a
bootstrap in progress fails ("Error on delete of '/tmp/#sql-temptable-...'").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import MySQLdb

from testkit.processes import mysql_url

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 60.0


@dataclass
class MariaDBServer:
    """One mariadbd process on 127.0.0.1:`port`, its files under `basedir` (created, and removed by `remove`)."""

    port: int
    basedir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="creditshop-mariadb-")))
    process: subprocess.Popen | None = None

    @property
    def datadir(self) -> Path:
        return self.basedir / "data"

    @property
    def tmpdir(self) -> Path:
        return self.basedir / "tmp"

    @property
    def error_log(self) -> Path:
        return self.basedir / "error.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def url(self, database: str, *, user: str = "root", password: str = "") -> str:
        """Return a DATABASE_URL-style URL for a database on this server."""
        return mysql_url(host="127.0.0.1", port=self.port, name=database, user=user, password=password)

    def install(self) -> None:
        """Create the system tables in an empty data directory (a few seconds)."""
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        command = [
            INSTALL_DB,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--tmpdir={self.tmpdir}",  # passed on to the bootstrap server
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *self._run_as(),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed ({result.returncode}): {result.stderr[-2000:]}")

    def start(self, *, timeout: float = START_TIMEOUT_SECONDS) -> float:
        """Start mariadbd on the data directory and wait until it takes connections; return the seconds it took."""
        started = time.monotonic()
        command = [
            MARIADBD,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--tmpdir={self.tmpdir}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            # Unix socket paths are limited to 107 bytes; basedir comes from mkdtemp, so this one is short.
            f"--socket={self.basedir / 'mysqld.sock'}",
            f"--pid-file={self.basedir / 'mysqld.pid'}",
            f"--log-error={self.error_log}",
            "--skip-name-resolve",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
            # Small, because the machine is shared: the credits tables of a test fit many times over.
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=32M",
            "--max-connections=300",
            *self._run_as(),
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        while not self.ping():
            if self.process.poll() is not None:
                raise RuntimeError(f"mariadbd exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() - started > timeout:
                self.kill()
                raise RuntimeError(f"mariadbd did not take connections within {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.1)
        return time.monotonic() - started

    def ping(self) -> bool:
        try:
            MySQLdb.connect(host="127.0.0.1", port=self.port, user="root", password="", connect_timeout=2).close()
        except MySQLdb.Error:
            return False
        return True

    def kill(self) -> None:
        """Crash the server (SIGKILL, no shutdown): every connection drops and new ones are refused."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """Shut the server down cleanly (SIGTERM), killing it if it does not finish in time."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self.process = None

    def remove(self) -> None:
        """Stop the server and delete its files."""
        self.stop()
        shutil.rmtree(self.basedir, ignore_errors=True)

    def create_database(self, name: str) -> None:
        conn = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root", password="")
        try:
            conn.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        finally:
            conn.close()

    def log_tail(self, lines: int = 30) -> str:
        if not self.error_log.exists():
            return ""
        return "\n".join(self.error_log.read_text(errors="replace").splitlines()[-lines:])

    @staticmethod
    def _run_as() -> list[str]:
        # mariadbd refuses to run as root unless told to; the data directory then belongs to root.
        return ["--user=root"] if os.geteuid() == 0 else []
