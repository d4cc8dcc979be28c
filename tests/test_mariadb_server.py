"""testkit/mariadb_server.py's private server keeps its temporary files to itself, so servers that tests start at the
same moment (a bootstrap beside a start) cannot delete each other's."""

import tempfile
from pathlib import Path

import MySQLdb
import pytest

from testkit.mariadb_server import MariaDBServer
from testkit.processes import free_port

pytestmark = pytest.mark.slow


def test_a_private_server_neither_uses_nor_clears_the_shared_tmp():
    # What a starting mariadbd deletes in its tmpdir: another server's temporary table, here planted in the shared one.
    planted = Path(tempfile.gettempdir()) / f"#sql-temptable-creditshop-{free_port()}.MAI"
    planted.write_bytes(b"")
    server = MariaDBServer(port=free_port())
    try:
        server.install()
        server.start()
        connection = MySQLdb.connect(host="127.0.0.1", port=server.port, user="root", password="", connect_timeout=5)
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT @@tmpdir")
            tmpdir = cursor.fetchone()[0]
        finally:
            connection.close()

        assert tmpdir == str(server.tmpdir)
        assert planted.exists()
    finally:
        server.remove()
        planted.unlink(missing_ok=True)
