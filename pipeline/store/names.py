"""Collection names: the rules Chroma enforces, checked before anything is written.

Chroma refuses a name only when the collection is created, which is after the
catalog has recorded it; checking here first means a name Chroma would reject
never reaches the catalog.
"""

from __future__ import annotations

import ipaddress
import re

from ..errors import ConfigError

_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{1,510}[a-zA-Z0-9]$")


def name_problem(name: str) -> str | None:
    """Why Chroma would refuse ``name`` as a collection name, or None if it accepts it."""
    if not _NAME.match(name):
        return ("use 3-512 characters from letters, digits, '.', '_' and '-', starting and ending "
                "with a letter or digit")
    if ".." in name:
        return "two dots in a row are not allowed"
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return None
    return "a name that reads as an IPv4 address is not allowed"


def check_collection_name(name: str) -> str:
    """``name``, or a :class:`ConfigError` that says why it cannot name a collection."""
    problem = name_problem(name)
    if problem:
        raise ConfigError(f"invalid collection name {name!r}: {problem}")
    return name
