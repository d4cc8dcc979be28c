"""The Spark driver JVM's console output, without the start-up warning no option turns off.

Spark's launcher starts every JVM with ``--add-modules=jdk.incubator.vector`` (spark-launcher's JavaModuleOptions), and
the JVM then prints "WARNING: Using incubator modules: jdk.incubator.vector" to its stderr, which PySpark leaves
inherited from this process. No JVM flag or Spark property silences it, so the JVM gets a pipe for stderr instead:
a thread passes every line on to the real stderr except that one.
"""

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

DROPPED_PREFIXES = (b"WARNING: Using incubator modules:",)


def _forward(read_fd: int, write_fd: int) -> None:
    """Copy lines from the pipe to the real stderr, minus the dropped ones, until every writer has closed it."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe, os.fdopen(write_fd, "wb", buffering=0) as stderr:
        pending = b""
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not line.startswith(DROPPED_PREFIXES))
            if kept:
                stderr.write(kept)
        if pending and not pending.startswith(DROPPED_PREFIXES):
            stderr.write(pending)


@contextmanager
def child_stderr_filtered() -> Iterator[threading.Thread]:
    """Give processes started in this block a stderr without the JVM's incubator warning; yield the forwarder.

    This process's own stderr is the real one again after the block; the children keep the pipe, and the forwarder
    ends when the last of them exits.
    """
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    real_stderr = os.dup(2)
    forwarder = threading.Thread(target=_forward, args=(read_fd, os.dup(real_stderr)), name="jvm-stderr", daemon=True)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    forwarder.start()
    try:
        yield forwarder
    finally:
        sys.stderr.flush()
        os.dup2(real_stderr, 2)
        os.close(real_stderr)
