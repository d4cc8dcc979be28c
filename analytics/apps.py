"""Analytics app: nightly Spark jobs, consistency checks and their reports."""

from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    name = "analytics"
