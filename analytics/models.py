"""Analytics tables: the history of nightly runs, what their checks found, and the report tables they fill."""

import datetime

from django.db import models
from django.utils import timezone


class NightlyRun(models.Model):
    """One invocation of run_nightly_reports, covering `days` days ending on `date`."""

    class Status(models.TextChoices):
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        # Stopped by SIGTERM (a worker's shutdown, a deploy): not the job's fault; a re-run picks the day up.
        INTERRUPTED = "interrupted", "interrupted"

    date = models.DateField()
    days = models.PositiveSmallIntegerField(default=1)
    repair = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    # The stage the run is in (or failed in), for the admin and the staff page while it runs.
    stage = models.CharField(max_length=64, blank=True, default="")
    spark_master = models.CharField(max_length=255, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    # The instant the checks judged against: an order is missing its credit if older than as_of minus the grace.
    as_of = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)
    orders = models.PositiveBigIntegerField(default=0)
    credits = models.PositiveBigIntegerField(default=0)
    violations = models.PositiveBigIntegerField(default=0)
    ok = models.BooleanField(null=True, blank=True)
    reenqueued = models.PositiveIntegerField(default=0)
    repair_summary = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "analytics_nightly_runs"
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["date", "status"], name="analytics_runs_date_idx")]

    def __str__(self) -> str:
        return f"nightly run {self.pk} for {self.date} ({self.status})"

    @property
    def first_date(self) -> datetime.date:
        return self.date - datetime.timedelta(days=self.days - 1)


class CheckResult(models.Model):
    """The outcome of one consistency check for one day of one run."""

    run = models.ForeignKey(NightlyRun, on_delete=models.CASCADE, related_name="check_results")
    date = models.DateField()
    name = models.CharField(max_length=64)
    count = models.PositiveBigIntegerField()
    sample = models.JSONField(default=list)
    note = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        db_table = "analytics_check_results"
        constraints = [
            models.UniqueConstraint(fields=["run", "date", "name"], name="analytics_check_results_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.name} on {self.date}: {self.count}"


class Violation(models.Model):
    """One violating row found by a check (at most ANALYTICS_MAX_STORED_VIOLATIONS per check and day)."""

    run = models.ForeignKey(NightlyRun, on_delete=models.CASCADE, related_name="violation_rows")
    date = models.DateField()
    check_name = models.CharField(max_length=64)
    # The id an operator acts on: an order id, a transaction id, a credit id or a dead letter id (see checks.py).
    entity_id = models.CharField(max_length=64)
    detail = models.JSONField(default=dict)

    class Meta:
        db_table = "analytics_violations"
        indexes = [models.Index(fields=["run", "date", "check_name"], name="analytics_violations_run_idx")]

    def __str__(self) -> str:
        return f"{self.check_name} {self.entity_id} on {self.date}"


class DailyMetrics(models.Model):
    """Credit analytics for one day; a rerun for the day replaces the row."""

    date = models.DateField(unique=True)
    run = models.ForeignKey(NightlyRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    orders = models.PositiveBigIntegerField()
    order_units = models.PositiveBigIntegerField()
    users = models.PositiveBigIntegerField()
    new_users = models.PositiveBigIntegerField()
    credited_users = models.PositiveBigIntegerField()
    credits_awarded = models.PositiveBigIntegerField()
    credits_total = models.PositiveBigIntegerField()
    credits_per_user_p50 = models.FloatField(null=True, blank=True)
    credits_per_user_p90 = models.FloatField(null=True, blank=True)
    credits_per_user_p99 = models.FloatField(null=True, blank=True)
    credits_per_user_max = models.BigIntegerField(null=True, blank=True)
    credits_per_user_mean = models.FloatField(null=True, blank=True)
    latency_count = models.PositiveBigIntegerField(default=0)
    latency_p50_seconds = models.FloatField(null=True, blank=True)
    latency_p95_seconds = models.FloatField(null=True, blank=True)
    latency_p99_seconds = models.FloatField(null=True, blank=True)
    latency_max_seconds = models.FloatField(null=True, blank=True)
    histogram = models.JSONField(default=list)
    top_users = models.JSONField(default=list)
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "analytics_daily_metrics"
        ordering = ["-date"]
        verbose_name_plural = "daily metrics"

    def __str__(self) -> str:
        return f"metrics for {self.date}"


class UserDailyCredits(models.Model):
    """Orders and credits of one user on one day; a rerun for the day replaces the day's rows."""

    date = models.DateField()
    # A plain id, not a foreign key: a report row must not stop a user from being deleted.
    user_id = models.BigIntegerField()
    orders = models.PositiveIntegerField()
    order_units = models.PositiveBigIntegerField()
    credits_awarded = models.PositiveIntegerField()
    credits_total = models.PositiveBigIntegerField()

    class Meta:
        db_table = "analytics_user_daily_credits"
        constraints = [
            models.UniqueConstraint(fields=["date", "user_id"], name="analytics_user_daily_uniq"),
        ]
        verbose_name_plural = "user daily credits"

    def __str__(self) -> str:
        return f"user {self.user_id} on {self.date}"
