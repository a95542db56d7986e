"""Sizes and ages on the command line: parse ``500M`` / ``7d``, print ``3h`` (sizes print with
:func:`hyperexport.base.sizes.human_size`).

Sizes use binary multiples (``K`` = 1024 bytes, ``M`` = 1024², ...), as ``du -h`` does; ``500M``,
``500MB``, ``500MiB`` and ``500m`` all mean 500 MiB. Ages are one or more ``<number><unit>``
with units (lower case) ``s``, ``m`` (minutes), ``h``, ``d``, ``w``: ``7d``, ``12h``, ``1d12h`` (or ``0``).
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_AGE_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``"500M"`` -> 524288000 bytes.

    Raises:
        ValueError: ``text`` is not a size (the message says what is expected).
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size: use e.g. 500M, 2G, 1.5G or 100000 (bytes)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_age(text: str) -> float:
    """``"1d12h"`` -> 129600.0 seconds.

    Raises:
        ValueError: ``text`` is not an age (the message says what is expected).
    """
    compact = text.strip()
    if compact == "0":
        return 0.0
    if not _AGE.fullmatch(compact):
        raise ValueError(f"{text!r} is not an age: use e.g. 7d, 12h, 30m, 1d12h or 0s")
    return sum(float(n) * _AGE_UNITS[unit] for n, unit in _AGE_PART.findall(compact))


def human_age(seconds: float) -> str:
    """``90`` -> ``"1m"``, ``7200`` -> ``"2h"``, ``200000`` -> ``"2d"``: the largest whole unit."""
    seconds = max(0.0, seconds)
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
