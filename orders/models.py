"""Orders and the idempotency records that make retried order requests safe."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.contract import ORDER_TOTAL_MAX, ORDER_TOTAL_MIN


class Order(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="orders")
    goods_name = models.CharField(max_length=255)
    total = models.PositiveIntegerField()
    # The id of the transaction_log row written with this order, kept here so reads need no join.
    transaction_id = models.CharField(max_length=32, unique=True, db_collation="ascii_bin")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "orders"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(total__gte=ORDER_TOTAL_MIN) & models.Q(total__lte=ORDER_TOTAL_MAX),
                name="orders_total_range",
            ),
        ]

    def __str__(self) -> str:
        return f"Order {self.pk} ({self.goods_name} x{self.total})"


class IdempotencyKey(models.Model):
    """A client's Idempotency-Key, unique per user, bound to the order it produced and the body that asked."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    # Binary, no-pad collation: keys differing only in case or trailing spaces are different keys.
    key = models.CharField(max_length=255, db_collation="utf8mb4_nopad_bin")
    fingerprint = models.CharField(max_length=64, db_collation="ascii_bin")
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="idempotency_key")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "idempotency_keys"
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_keys_user_key_uniq")]
        # Retention deletes the oldest keys in batches (orders.services.idempotency_keys_purge).
        indexes = [models.Index(fields=["created_at"], name="idempotency_keys_created_idx")]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.key}"
