"""Why a credits message could not be applied; credits.retry decides which of these are worth retrying."""

from config.errors import ApplicationError


class MalformedMessage(ApplicationError):
    status = 422


class UnsupportedSchemaVersion(ApplicationError):
    status = 422
