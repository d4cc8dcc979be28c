"""The tests' password hasher: Django's PBKDF2 at one iteration.

PBKDF2 is slow by design, and every password a test sets and every login it makes pays it (a throttle test makes
seven). What the tests prove does not rest on the hash's strength. The hash keeps PBKDF2's algorithm name and records
its iteration count, so a service the tests start in a process of its own, with production's hashers, verifies it
(and upgrades it at a successful login, as it would any older hash).
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1


PASSWORD_HASHERS = [f"{__name__}.{OneIterationPBKDF2PasswordHasher.__qualname__}"]
