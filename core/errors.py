"""Domain errors that services raise and the API layer maps to HTTP in one place."""


class ApplicationError(Exception):
    """A failure the caller can act on; `status` is the HTTP status the API answers with."""

    status = 400

    def __init__(self, message: str, *, extra: dict | None = None):
        super().__init__(message)
        self.message = message
        self.extra = extra or {}


class ReasonRequired(ApplicationError):
    """An operator's action that must say why (discarding a message or a dead letter) was given no reason."""

    status = 400
