"""Admin for the outbox: find stuck, failing and dead messages among millions, and retry or discard them."""

from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.timesince import timesince

from core.admin import FastListAdmin, ReadOnlyAdminMixin
from core.contract import BUSINESS_ORDER
from outbox.models import TransactionLog
from outbox.services import messages_discard, messages_retry_now

Status = TransactionLog.Status
# "Select all N" on a filter matching millions must not turn into one enormous UPDATE.
MAX_ACTION_ROWS = 10_000


class DeliveryFilter(admin.SimpleListFilter):
    """Delivery states a person asks about, each one an index range on (status, next_attempt_at)."""

    title = "delivery"
    parameter_name = "delivery"
    # The ordering that walks the index each choice filters on, so a page never sorts the whole match.
    ORDERING = {
        "due": ("next_attempt_at",),
        "backing_off": ("next_attempt_at",),
        "stuck": ("next_attempt_at",),
        "dead": ("-next_attempt_at",),
        "published": ("-published_at",),
        "discarded": ("-next_attempt_at",),
    }

    def lookups(self, request, model_admin):
        return [
            ("due", "Due now"),
            ("backing_off", "Backing off after a failure"),
            ("stuck", f"Stuck (pending over {settings.OUTBOX_STUCK_SECONDS} s)"),
            ("dead", "Dead"),
            ("published", "Published"),
            ("discarded", "Discarded"),
        ]

    def queryset(self, request, queryset):
        now = timezone.now()
        pending = queryset.filter(status=Status.PENDING)
        match self.value():
            case "due":
                return pending.filter(next_attempt_at__lte=now)
            case "backing_off":
                return pending.filter(next_attempt_at__gt=now, attempts__gt=0)
            case "stuck":
                return pending.filter(created_at__lte=now - timedelta(seconds=settings.OUTBOX_STUCK_SECONDS))
            case "dead":
                return queryset.filter(status=Status.DEAD)
            case "published":
                return queryset.filter(status=Status.PUBLISHED)
            case "discarded":
                return queryset.filter(status=Status.DISCARDED)
        return queryset


class DiscardForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        max_length=2000,
        help_text="Why these messages must never be published. Recorded on each row with your username.",
    )


@admin.register(TransactionLog)
class TransactionLogAdmin(ReadOnlyAdminMixin, FastListAdmin):
    list_display = ("id", "business", "foreign_key", "status", "attempts", "short_error", "age", "next_attempt_at")
    list_filter = (DeliveryFilter,)
    search_fields = ("=id",)
    search_help_text = "An exact transaction id, or an order id."
    ordering = ("-created_at",)
    actions = ("retry_now", "discard")
    readonly_fields = (
        "id",
        "business",
        "foreign_key",
        "payload",
        "status",
        "attempts",
        "next_attempt_at",
        "published_at",
        "last_error",
        "created_at",
        "discarded_reason",
        "discarded_by",
    )

    def get_ordering(self, request):
        return DeliveryFilter.ORDERING.get(request.GET.get(DeliveryFilter.parameter_name), self.ordering)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        # Each branch is an index lookup: the primary key, or UNIQUE (business, foreign_key).
        return queryset.filter(Q(id=term) | Q(business=BUSINESS_ORDER, foreign_key=term)), False

    @admin.display(description="last error")
    def short_error(self, obj: TransactionLog) -> str:
        return obj.last_error if len(obj.last_error) <= 80 else obj.last_error[:79] + "…"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: TransactionLog) -> str:
        return timesince(obj.created_at, timezone.now())

    def has_manage_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_staff and request.user.has_perm("outbox.manage_outbox")

    def _selected_ids(self, request, queryset) -> list[str] | None:
        ids = list(queryset.order_by().values_list("id", flat=True)[: MAX_ACTION_ROWS + 1])
        if len(ids) > MAX_ACTION_ROWS:
            self.message_user(
                request, f"Select at most {MAX_ACTION_ROWS:,} messages at a time (narrow the filter).", messages.ERROR
            )
            return None
        return ids

    @admin.action(description="Retry now (back to pending, due now)", permissions=["manage"])
    def retry_now(self, request, queryset):
        ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        changed = messages_retry_now(ids=ids)
        skipped = len(ids) - changed
        note = f" ({skipped} published meanwhile or already published, left alone)" if skipped else ""
        self.message_user(request, f"{changed} message(s) will be published again shortly{note}.", messages.SUCCESS)
        return None

    @admin.action(description="Discard (never publish; asks for a reason)", permissions=["manage"])
    def discard(self, request, queryset):
        ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        form = DiscardForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            changed = messages_discard(ids=ids, reason=form.cleaned_data["reason"], actor=request.user.get_username())
            skipped = len(ids) - changed
            note = f" ({skipped} not pending or dead, left alone)" if skipped else ""
            self.message_user(request, f"Discarded {changed} message(s){note}.", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Discard outbox messages",
            "opts": self.model._meta,
            "form": form,
            "ids": ids,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/outbox/transactionlog/discard.html", context)
