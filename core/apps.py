"""core as an installed app: only so Django finds its templates (it has no models)."""

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
