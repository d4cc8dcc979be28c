"""Names the extract step falls back on match the tables they stand for."""

from analytics.extract import DEAD_LETTER_MODEL, DEAD_LETTER_TABLE
from credits.models import DeadLetter


def test_the_fallback_dead_letter_table_name_is_the_models_table():
    assert (DeadLetter._meta.app_label, DeadLetter.__name__) == DEAD_LETTER_MODEL
    assert DeadLetter._meta.db_table == DEAD_LETTER_TABLE
