"""The broker as scripts/setup.sh leaves it: a delivery may stay unacknowledged as long as the nightly run lasts."""

import subprocess

from django.conf import settings

from core.contract import RUN_NIGHTLY_TASK


def broker_consumer_timeout_ms() -> int:
    output = subprocess.run(
        ["rabbitmqctl", "-q", "eval", "application:get_env(rabbit, consumer_timeout)."],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    digits = "".join(character for character in output if character.isdigit())
    assert digits, f"RabbitMQ has no consumer_timeout: {output!r}"
    return int(digits)


def test_rabbitmq_keeps_the_nightly_runs_message_past_its_hard_time_limit():
    # The nightly task acks late, so its message stays unacknowledged for the whole run; past consumer_timeout
    # RabbitMQ would close the analytics worker's channel mid-run and redeliver the message.
    nightly_hard_limit_ms = settings.CELERY_TASK_ANNOTATIONS[RUN_NIGHTLY_TASK]["time_limit"] * 1000

    assert broker_consumer_timeout_ms() > nightly_hard_limit_ms
