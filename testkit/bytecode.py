"""Bytecode cached in the checkout, whatever the machine's PYTHONDONTWRITEBYTECODE says.

Without the cache, each worker of each run rewrites every test module's assertions again (pytest caches a rewrite
only where bytecode may be written), and every process the tests start (a web server, a worker, a command) compiles
the project's modules again. The caches are `__pycache__` directories, which git ignores.
"""

import os
import sys


def cache_in_checkout() -> None:
    """Let this process, and every process it starts, write bytecode (conftest.py calls it before any test module is
    imported)."""
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
