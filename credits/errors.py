"""Why a credits message could not be applied; credits.retry decides which of these are worth retrying."""

from core.errors import ApplicationError


class MalformedMessage(ApplicationError):
    status = 422


class UnsupportedSchemaVersion(ApplicationError):
    status = 422


class NewerSchemaVersion(ApplicationError):
    """A version newer than this consumer accepts: a newer consumer may take it (forwarded to its version's queue)."""

    status = 422


class Redelivered(ApplicationError):
    """Delivered more often than the retry limit allows and never acknowledged: its workers died holding it."""

    status = 422
