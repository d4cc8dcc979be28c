"""Admin for orders: searchable, date-filtered, and fast on millions of rows."""

from django.contrib import admin

from core.admin import FastListAdmin, ReadOnlyAdminMixin
from orders.models import Order


@admin.register(Order)
class OrderAdmin(ReadOnlyAdminMixin, FastListAdmin):
    # Orders change only through order_create: an edited total would disagree with its message and its credit.
    list_display = ("id", "user", "goods_name", "total", "transaction_id", "created_at")
    list_select_related = ("user",)
    list_filter = (("created_at", admin.DateFieldListFilter),)
    search_fields = ("=id", "=user__username", "=user__id", "goods_name", "=transaction_id")
    ordering = ("-id",)
