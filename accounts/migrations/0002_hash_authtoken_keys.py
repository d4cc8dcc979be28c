"""Hash DRF's plain-text authtoken keys into api_tokens, so every existing key keeps working as a hashed token.

The authtoken table is read with plain SQL when it exists, and this migration does not depend on the authtoken app:
a later release drops that table with `migrate authtoken zero` (docs/OPERATIONS.md "API tokens"), which must not
unapply this. Keys already hashed are skipped, so running it again (after old processes made more) adds only those.
"""

from datetime import UTC

from django.db import migrations

from accounts.keys import key_digest, key_prefix

AUTHTOKEN_TABLE = "authtoken_token"
NAME = "drf authtoken"


def aware(value):
    # Plain SQL skips the ORM's converters: MariaDB's DATETIME comes back naive, in UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def hash_authtoken_keys(apps, schema_editor):
    connection = schema_editor.connection
    if AUTHTOKEN_TABLE not in connection.introspection.table_names():
        return
    api_token = apps.get_model("accounts", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {connection.ops.quote_name('key')}, user_id, created FROM {AUTHTOKEN_TABLE}")  # noqa: S608
        rows = cursor.fetchall()
    known = set(api_token.objects.using(connection.alias).values_list("digest", flat=True))
    api_token.objects.using(connection.alias).bulk_create(
        [
            api_token(user_id=user_id, name=NAME, prefix=key_prefix(key), digest=key_digest(key), created_at=aware(created))
            for key, user_id, created in rows
            if key_digest(key) not in known
        ],
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial")]

    operations = [migrations.RunPython(hash_authtoken_keys, migrations.RunPython.noop, elidable=True)]
