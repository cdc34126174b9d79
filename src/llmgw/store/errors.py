"""The exceptions the store raises, and nothing else leaves it.

    StoreError                  base: anything the store could not do
    ├── BadStoreUrl             --store / data dir cannot be turned into a database URL
    ├── StoreUnavailable        the database did not answer (not running, refused, timed out)
    ├── NotFound                the key (or other row) named by the caller does not exist
    ├── Conflict                the change would break a uniqueness rule (e.g. an active name)
    │   └── AlreadyExists       creating a row whose key (e.g. a catalog model's name) is taken
    ├── StaleEpoch              a leader's write carries an epoch the lease no longer has (fenced)
    ├── Ambiguous               a name or prefix matches several keys
    └── InvalidValue            a value the store refuses to persist (naive datetime, bad period)

Driver and SQLAlchemy exceptions are translated at the boundary (`raise X from exc`),
so callers never import sqlalchemy, asyncpg or sqlite3 to handle store failures.

Not guaranteed: that a `StoreUnavailable` is transient; a wrong password looks the
same as a database that is restarting. Callers decide whether to retry.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store could not do what was asked; the message says why and what to do."""


class BadStoreUrl(StoreError):
    """The store location given on the command line or in the config is unusable."""


class StoreUnavailable(StoreError):
    """The database could not be reached or stopped answering."""


class NotFound(StoreError):
    """The row named by the caller does not exist."""


class Conflict(StoreError):
    """The change would break a uniqueness rule; the message names the clashing row."""


class AlreadyExists(Conflict):
    """Creating a row whose primary key another row already has; the message names it."""


class StaleEpoch(StoreError):
    """A write carried a leadership epoch that is no longer the lease's: the writer
    lost its lease (e.g. it was paused past its expiry) and must not write."""


class Ambiguous(StoreError):
    """A name or prefix given to look a key up matches several keys; the message lists them."""


class InvalidValue(StoreError, ValueError):
    """A value the store refuses to persist; the message names the field."""
