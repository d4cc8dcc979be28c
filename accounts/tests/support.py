"""Helpers the accounts tests share."""

from rest_framework.test import APIClient


def client_for(key: str) -> APIClient:
    """Return an API client that sends `Authorization: Token <key>` on every request."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client
