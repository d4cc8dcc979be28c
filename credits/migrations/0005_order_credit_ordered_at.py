"""Date a credit by its order (message version 2): a nullable order_credits.ordered_at and an index on it.

Both statements run online while credits are awarded (docs/OPERATIONS.md, "Schema changes while orders flow"):
adding a nullable column at the end of the table is INSTANT on MariaDB 10.3+ and MySQL 8.0.12+ (a metadata change;
no row is rewritten), and the index is built INPLACE with LOCK=NONE (reads and writes go on while it builds). Naming
the algorithm and lock makes the server refuse, instead of silently copying the table under a lock, should either
ever be impossible. Django's AddField and AddIndex would not name them, hence RunSQL with the same state operations;
the new reason on dead letters changes choices only (no SQL).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("credits", "0004_order_credit_amount"),
    ]

    operations = [
        migrations.RunSQL(
            sql="ALTER TABLE order_credits ADD COLUMN ordered_at datetime(6) NULL, ALGORITHM=INSTANT",
            reverse_sql="ALTER TABLE order_credits DROP COLUMN ordered_at",
            state_operations=[
                migrations.AddField(
                    model_name="ordercredit",
                    name="ordered_at",
                    field=models.DateTimeField(blank=True, null=True),
                ),
            ],
        ),
        migrations.RunSQL(
            sql="ALTER TABLE order_credits ADD INDEX order_credits_ordered_at_idx (ordered_at),"
            " ALGORITHM=INPLACE, LOCK=NONE",
            reverse_sql="ALTER TABLE order_credits DROP INDEX order_credits_ordered_at_idx, ALGORITHM=INPLACE, LOCK=NONE",
            state_operations=[
                migrations.AddIndex(
                    model_name="ordercredit",
                    index=models.Index(fields=["ordered_at"], name="order_credits_ordered_at_idx"),
                ),
            ],
        ),
        migrations.AlterField(
            model_name="deadletter",
            name="reason",
            field=models.CharField(
                choices=[
                    ("malformed", "malformed message"),
                    ("unsupported_schema", "unsupported schema version"),
                    ("version_not_supported", "version not supported (waited for a newer consumer)"),
                    ("unexpected", "unexpected error"),
                    ("deadlock", "deadlock"),
                    ("lock_wait_timeout", "lock wait timeout"),
                    ("database_unavailable", "database unavailable"),
                ],
                max_length=32,
            ),
        ),
    ]
