"""Admin for API tokens: staff see each token's owner, name, prefix and expiry, and revoke them; never a key."""

from django.contrib import admin, messages
from django.utils import timezone

from accounts.models import ApiToken
from accounts.services import api_tokens_revoke_by_ids
from core.admin import FastListAdmin, ReadOnlyAdminMixin


class ExpiryFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return (("active", "active"), ("expired", "expired"))

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "expired":
            return queryset.filter(expires_at__lte=now)
        if self.value() == "active":
            return queryset.exclude(expires_at__lte=now)
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdminMixin, FastListAdmin):
    # Tokens are made by `manage.py create_api_token` (the key is printed once there); here they are only revoked.
    list_display = ("id", "user", "name", "key_prefix", "created_at", "expires_at", "expired")
    list_select_related = ("user",)
    list_filter = (ExpiryFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("=user__username", "name", "=prefix")
    fields = ("user", "name", "key_prefix", "created_at", "expires_at")
    readonly_fields = fields
    ordering = ("-id",)
    actions = ("revoke",)

    @admin.display(description="key starts with")
    def key_prefix(self, token: ApiToken) -> str:
        return f"{token.prefix}…"

    @admin.display(boolean=True)
    def expired(self, token: ApiToken) -> bool:
        return token.is_expired()

    def has_revoke_permission(self, request) -> bool:
        return request.user.has_perm("accounts.delete_apitoken")

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        revoked = api_tokens_revoke_by_ids(
            ids=list(queryset.values_list("pk", flat=True)), by=request.user.get_username()
        )
        self.message_user(request, f"Revoked {revoked} token(s); they are refused from now on.", messages.SUCCESS)
