"""Admin for the outbox: transaction_log rows, read-only."""

from django.contrib import admin

from orders.admin import FastListAdmin
from outbox.models import TransactionLog


@admin.register(TransactionLog)
class TransactionLogAdmin(FastListAdmin):
    list_display = (
        "id",
        "business",
        "foreign_key",
        "status",
        "attempts",
        "next_attempt_at",
        "published_at",
        "created_at",
    )
    list_filter = ("status",)
    search_fields = ("=id", "=foreign_key")
    ordering = ("-created_at",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
