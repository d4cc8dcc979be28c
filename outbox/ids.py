"""Transaction ids: 32 hex characters, time-ordered like UUIDv7 so InnoDB inserts stay sequential."""

import os
import time


def new_transaction_id() -> str:
    """Return a new id: 48 bits of Unix milliseconds followed by 80 random bits, as lowercase hex."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"
