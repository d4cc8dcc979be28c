"""Admin for credits: dead-lettered messages to replay or discard, and the awarded credits, read-only."""

from collections import Counter

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from core import tracing
from core.admin import FastListAdmin, ReadOnlyAdminMixin
from credits import services
from credits.models import DeadLetter, OrderCredit

REPLAY_PERMISSION = "replay_deadletter"
FAILURES_SHOWN = 5


class DiscardForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), max_length=2000, help_text="Why these are discarded."
    )


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdminMixin, FastListAdmin):
    list_display = (
        "id",
        "message_id",
        "order_id",
        "reason",
        "short_error",
        "attempts",
        "status",
        "first_failed_at",
        "last_failed_at",
    )
    list_filter = ("status", "reason", ("last_failed_at", admin.DateFieldListFilter))
    search_fields = ("=message_id", "=transaction_id", "=order_id", "error")
    ordering = ("-last_failed_at",)
    actions = ("replay", "discard")

    @admin.display(description="error")
    def short_error(self, obj: DeadLetter) -> str:
        return obj.error if len(obj.error) <= 120 else obj.error[:117] + "..."

    def has_replay_permission(self, request: HttpRequest) -> bool:
        """Return whether the user may replay or discard: staff holding credits.replay_deadletter."""
        return (
            request.user.is_active
            and request.user.is_staff
            and request.user.has_perm(f"{self.opts.app_label}.{REPLAY_PERMISSION}")
        )

    @admin.action(description="Replay selected dead letters (awards at most once)", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        by = request.user.get_username()
        letters = queryset.values_list("pk", "transaction_id", "traceparent", "tracestate")
        results = []
        for pk, transaction_id, traceparent, tracestate in letters:
            # The replay's span links to the trace the message was handled in (the order request's), which has
            # ended; the dead letter kept its context, so nothing is read from the order service's database.
            with tracing.span(
                "credits.dead_letter.replay",
                attributes={"creditshop.transaction_id": transaction_id},
                linked_to=[(traceparent, tracestate)] if traceparent else (),
            ):
                results.append(services.dead_letter_replay(dead_letter_id=pk, by=by))
        counts = Counter(result.outcome for result in results)
        self.message_user(
            request,
            f"Replayed {len(results)}: {counts[services.ReplayOutcome.AWARDED]} awarded, "
            f"{counts[services.ReplayOutcome.ALREADY_AWARDED]} already awarded, "
            f"{counts[services.ReplayOutcome.NOT_OPEN]} no longer open, "
            f"{counts[services.ReplayOutcome.FAILED]} failed again.",
            messages.SUCCESS if not counts[services.ReplayOutcome.FAILED] else messages.WARNING,
        )
        failed = [result for result in results if result.outcome == services.ReplayOutcome.FAILED]
        for result in failed[:FAILURES_SHOWN]:
            self.message_user(request, f"Dead letter {result.dead_letter_id}: {result.error}", messages.ERROR)

    @admin.action(description="Discard selected dead letters (asks for a reason)", permissions=["replay"])
    def discard(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> TemplateResponse | None:
        form = DiscardForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            count = services.dead_letters_discard(
                dead_letter_ids=queryset.values_list("pk", flat=True),
                by=request.user.get_username(),
                reason=form.cleaned_data["reason"],
            )
            self.message_user(request, f"Discarded {count} open dead letter(s).", messages.SUCCESS)
            return None
        return TemplateResponse(
            request,
            "admin/credits/deadletter/discard.html",
            {
                **self.admin_site.each_context(request),
                "title": "Discard dead letters",
                "opts": self.opts,
                "form": form,
                "dead_letters": queryset,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            },
        )


@admin.register(OrderCredit)
class OrderCreditAdmin(ReadOnlyAdminMixin, FastListAdmin):
    list_display = ("id", "order_id", "user_id", "amount", "transaction_id", "created_at")
    search_fields = ("=order_id", "=user_id", "=transaction_id")
    ordering = ("-id",)
