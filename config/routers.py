"""Database routing: each service's models live in that service's own database, and nothing else does."""

from django.db import connections

# App label -> database alias, for the apps that are not the order service's. Every other app (orders, outbox,
# analytics, auth, admin, sessions) belongs to the order service's database, `default`.
SERVICE_DATABASES = {"credits": "credits"}
DEFAULT_DATABASE = "default"


def database_for(app_label: str) -> str:
    """Return the alias of the database that holds this app's tables."""
    return SERVICE_DATABASES.get(app_label, DEFAULT_DATABASE)


def same_database(alias_a: str, alias_b: str) -> bool:
    """Return whether two aliases name one physical database (a small install points both URLs at one)."""

    def where(alias: str) -> tuple:
        db = connections[alias].settings_dict
        return (db.get("HOST") or "127.0.0.1", str(db.get("PORT") or 3306), db["NAME"])

    return where(alias_a) == where(alias_b)


class ServiceRouter:
    """Send the credits app to the `credits` database and every other app to `default`.

    Relations across the two are never followed: the credits models keep plain ids, not foreign keys.
    """

    def db_for_read(self, model, **hints) -> str:
        return database_for(model._meta.app_label)

    def db_for_write(self, model, **hints) -> str:
        return database_for(model._meta.app_label)

    def allow_migrate(self, db: str, app_label: str, **hints) -> bool:
        # An app's tables go wherever its database physically is. Django records a migration as applied even where
        # the router refuses it, and two aliases of one database share one django_migrations table: so when both
        # URLs name one database, whichever alias migrates first must create every table.
        return same_database(db, database_for(app_label))
