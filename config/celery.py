"""The Celery app: RabbitMQ broker, the outbox and credits queues, and delivery guarantees."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("creditshop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
