"""Credits awarded per order; the UNIQUE order_id is what makes a redelivered message a no-op."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class OrderCredit(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="credits")
    # No foreign-key constraint: credits belong to another service in the original design, and the nightly
    # job must be able to find (not be prevented from seeing) a credit whose order is gone.
    order = models.OneToOneField(
        "orders.Order", on_delete=models.DO_NOTHING, db_constraint=False, related_name="credit"
    )
    total = models.PositiveIntegerField()
    transaction_id = models.CharField(max_length=32, db_collation="ascii_bin", blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "order_credits"

    def __str__(self) -> str:
        return f"{self.total} credits for order {self.order_id}"
