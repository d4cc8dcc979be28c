"""Demo app: tools that load a consistent history into both services' databases and break it on purpose.

It writes the orders, outbox and credits tables directly, for demos, tests and benchmarks; no service imports it.
"""

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
