"""The web app with an `X-Worker-Pid` response header, so a test knows which gunicorn worker answered."""

import os

from config.wsgi import application as django_application


def application(environ, start_response):
    def start_with_pid(status, headers, exc_info=None):
        return start_response(status, [*headers, ("X-Worker-Pid", str(os.getpid()))], exc_info)

    return django_application(environ, start_with_pid)
