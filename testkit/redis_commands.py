"""Counting the commands the shared cache (Redis) is sent: one per round trip, as the service sends no pipelines."""

import threading

import pytest
from django.core.cache import caches


class RedisCommands:
    """Records the name of every command this thread sends through the default cache's redis-py clients.

    Other threads (a process's wake-up thread, say) are left out, so a request's own round trips are what is counted.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.sent: list[str] = []
        thread = threading.get_ident()
        client_class = type(caches["default"]._cache.get_client(write=True))
        execute_command = client_class.execute_command

        def counting(redis_client, *args, **kwargs):
            if threading.get_ident() == thread:
                self.sent.append(args[0])
            return execute_command(redis_client, *args, **kwargs)

        monkeypatch.setattr(client_class, "execute_command", counting)

    def during(self, action) -> list[str]:
        """Run `action` and return the commands it sent, less a script's first load on a server new to it: redis-py
        sends EVALSHA, meets NOSCRIPT, sends SCRIPT LOAD and EVALSHA again; the first two are left out."""
        self.sent.clear()
        action()
        sent = list(self.sent)
        for at in reversed([at for at, name in enumerate(sent) if name == "SCRIPT LOAD"]):
            del sent[at - 1 if at and sent[at - 1] == "EVALSHA" else at : at + 1]
        return sent
