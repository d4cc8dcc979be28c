"""Every task has a time limit: a hung award is stopped and its message awarded later; the nightly's limit follows
ANALYTICS_RUN_TIMEOUT_SECONDS."""

import re

import pytest
from django.conf import settings

from config.celery import app
from core.contract import AWARD_CREDITS_TASK, CREDITS_QUEUE, RUN_NIGHTLY_TASK
from credits.models import CreditBalance, DeadLetter, OrderCredit
from credits.tests.support import place_order, publish, queue_depth
from testkit.waiting import wait_for


def test_every_task_has_a_soft_then_a_hard_time_limit():
    app.loader.import_default_modules()
    assert 0 < app.conf.task_soft_time_limit < app.conf.task_time_limit
    assert app.conf.task_soft_time_limit > 2 * settings.CREDITS_OUTAGE_WAIT_SECONDS
    for name, task in app.tasks.items():
        if name.startswith(("outbox.", "orders.", "credits.", "analytics.")):
            assert (task.soft_time_limit or app.conf.task_soft_time_limit) > 0, name


def test_the_nightly_task_may_run_past_its_subprocess_timeout_and_no_longer():
    nightly = app.tasks[RUN_NIGHTLY_TASK]
    assert nightly.soft_time_limit == settings.ANALYTICS_RUN_TIMEOUT_SECONDS + 60
    assert nightly.time_limit == settings.ANALYTICS_RUN_TIMEOUT_SECONDS + 120


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_hung_award_is_stopped_at_the_hard_limit_and_its_message_awarded_once_later(db_faults, start_worker, user):
    worker = start_worker("hung", CELERY_TASK_SOFT_TIME_LIMIT="1", CELERY_TASK_TIME_LIMIT="2")
    order_id, payload = place_order(user=user, total=5)
    db_faults.set(order_id, sleep=6)  # the award's INSERT hangs in the database, past both limits
    publish(payload)
    hard_limit = rf"Hard time limit \([\d.]+s\) exceeded for {re.escape(AWARD_CREDITS_TASK)}"
    wait_for(lambda: worker.count(hard_limit), timeout=60, what="the hard time limit to stop the award")
    db_faults.clear(order_id)
    succeeded = rf"Task {re.escape(AWARD_CREDITS_TASK)}\[[^\]]+\] succeeded in [^:]+: '(\w+)'"
    wait_for(lambda: re.findall(succeeded, worker.log()), timeout=60, what="the message to be awarded")
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert CreditBalance.objects.get(user_id=user.pk).balance == 10
    assert not DeadLetter.objects.exists()
    worker.stop()
    assert queue_depth(CREDITS_QUEUE) == 0
