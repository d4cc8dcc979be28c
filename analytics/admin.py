"""Admin for the analytics app: run history (read-only) with what each run's checks found."""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from analytics.models import CheckResult, DailyMetrics, NightlyRun


class CheckResultInline(admin.TabularInline):
    model = CheckResult
    fields = ("date", "name", "count", "sample", "note")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("date", "id")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(NightlyRun)
class NightlyRunAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "date",
        "days",
        "status",
        "stage",
        "started_at",
        "duration_seconds",
        "orders",
        "credits",
        "violations",
        "ok",
        "repair",
        "reenqueued",
        "report",
    )
    list_filter = ("status", "ok", "repair")
    date_hierarchy = "started_at"
    inlines = [CheckResultInline]

    @admin.display(description="report")
    def report(self, run: NightlyRun) -> str:
        return format_html('<a href="{}">runs and reports</a>', reverse("analytics:run-detail", args=[run.pk]))


@admin.register(DailyMetrics)
class DailyMetricsAdmin(ReadOnlyAdmin):
    list_display = (
        "date",
        "orders",
        "users",
        "new_users",
        "credits_awarded",
        "credits_total",
        "credits_per_user_p50",
        "latency_p95_seconds",
        "run",
    )
    date_hierarchy = "date"
