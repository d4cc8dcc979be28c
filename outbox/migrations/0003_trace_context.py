from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0002_manage_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="transactionlog",
            name="traceparent",
            field=models.CharField(blank=True, db_collation="ascii_bin", db_default="", default="", max_length=55),
        ),
        migrations.AddField(
            model_name="transactionlog",
            name="tracestate",
            field=models.CharField(blank=True, db_collation="ascii_bin", db_default="", default="", max_length=512),
        ),
    ]
