"""API keys as made: the mark first, so none begins with "-", and the prefixes a key's row is looked up by."""

from accounts.keys import KEY_MARK, KEY_PREFIX_LENGTH, key_new, key_prefix, key_prefixes


def test_no_key_of_ten_thousand_begins_with_a_dash():
    keys = [key_new() for _ in range(10_000)]

    assert sum(key.startswith("-") for key in keys) == 0
    assert all(key.startswith(KEY_MARK) for key in keys)
    assert len(set(keys)) == len(keys)


def test_a_new_key_is_found_by_the_characters_after_the_mark():
    key = key_new()

    assert key_prefix(key) == key[len(KEY_MARK) :][:KEY_PREFIX_LENGTH]
    assert key_prefix(key) in key_prefixes(key)


def test_a_key_without_the_mark_is_found_by_its_first_characters():
    assert key_prefixes("-abcdefghij") == ("-abcdefg", "-abcdefg")


def test_a_key_made_before_the_mark_that_begins_with_it_is_found_either_way():
    # Its row was stored with its first characters; a new key's with those after the mark.
    assert key_prefixes("cs_abcdefghij") == ("abcdefgh", "cs_abcde")
