"""The ids the hub hands out that name something across the whole realm.

Session and publication ids are global-scope ids (Basic Profile, "IDs"):
drawn at random from [1, 2^53].  Registrations and subscriptions are
router-scope and may count (``itertools.count``).  Nothing is authorised by
either kind; a session id is still drawn from the system's generator, so a
peer cannot guess another's, while a publication id, one per event, comes
from Python's own generator (seeded from the system's), which takes no
system call: 1 % of the server at 5,000 nodes.  The hub is given both
generators (``Hub(session_ids=, publication_ids=)``) and makes these only
when it is not.
"""

from __future__ import annotations

import random

MAX_ID = 2**53


def global_id(rng: random.Random) -> int:
    """A global-scope id drawn from *rng*: in [1, 2^53]."""
    return rng.randint(1, MAX_ID)


def session_ids() -> random.Random:
    """The generator a hub draws session ids from unless it is given one: the system's."""
    return random.SystemRandom()


def publication_ids() -> random.Random:
    """The generator a hub draws publication ids from unless it is given one: Python's, seeded from the system."""
    return random.Random()
