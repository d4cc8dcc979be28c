"""Credits app: the idempotent consumer that awards credits per order."""

from django.apps import AppConfig


class CreditsConfig(AppConfig):
    name = "credits"
