"""Admin building blocks shared by the apps: list pages that stay fast on tables of millions of rows."""

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connection
from django.utils.functional import cached_property


class FastCountPaginator(Paginator):
    """A paginator that never counts a big table.

    Unfiltered, it reads InnoDB's row estimate; filtered, it counts at most `count_cap` + 1 matches, so a filter
    matching millions still answers at once (the page then shows the cap, meaning "at least this many").
    """

    count_cap = 10_000

    @cached_property
    def count(self) -> int:
        capped = self.object_list[: self.count_cap + 1].count()
        if capped <= self.count_cap or self.object_list.query.where:
            return capped
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_rows FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s",
                [self.object_list.model._meta.db_table],
            )
            row = cursor.fetchone()
        return max(capped, int(row[0] or 0)) if row else capped


class FastListAdmin(admin.ModelAdmin):
    """List-page settings for big tables: bounded counts, no full-table count beside the filters."""

    paginator = FastCountPaginator
    show_full_result_count = False
    list_per_page = 50


class ReadOnlyAdminMixin:
    """Rows are shown, never added, edited or deleted here; changes go through audited actions or services only."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
