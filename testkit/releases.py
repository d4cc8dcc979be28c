"""A checkout of an earlier release beside this one, for running its processes next to this release's in a test."""

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from testkit.harness import ROOT

# The last release before credit messages were routed by version: its relay publishes every version to `credits`, and
# its consumers take only `credits`, handing back a version they do not accept.
BEFORE_VERSION_ROUTING = "d5920e855944ec7fa7eeb2b6ef2f48b3407173fe"


@contextlib.contextmanager
def release_checkout(commit: str) -> Iterator[Path]:
    """Yield a detached git worktree of `commit` in a temporary directory, removed afterwards.

    Its processes run with this checkout's virtualenv (the harness starts them by its absolute path): a release's
    requirements must be installed there.
    """
    with tempfile.TemporaryDirectory(prefix="creditshop-release-") as parent:
        path = Path(parent) / "checkout"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
            check=True,
            capture_output=True,
        )
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)
