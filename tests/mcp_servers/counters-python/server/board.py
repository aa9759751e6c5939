"""The counter board's store (a module of the server's own: the server imports it, nothing is cached beside it)."""

import os
import sqlite3


def store() -> sqlite3.Connection:
    """The SQLite store the environment gives the server ($TRAJFORGE_STORE); its only state."""
    return sqlite3.connect(os.environ["TRAJFORGE_STORE"])
