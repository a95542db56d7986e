"""The cache's own random secret, which keys the digests of environment values in its records.

A stage key covers the values of the environment variables a build declares (as SHA-256
digests, so that the same value gives the same key on every machine). The records a cache keeps
for "why it reran" (``runs/``) hold the key material, but never such a digest: each is replaced
by an HMAC-SHA256 under this secret (:func:`.keys.recorded_material`), so two
records of one cache still tell whether a value changed, while a record shows nothing a guess of
the value could be checked against without the secret, and the same value looks different in
every cache. The secret is ``<cache>/index/record-secret`` (32 random bytes, mode 0600), made
on first use by a cache that can be written; it is never pushed to a remote.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

#: Where the secret lives, relative to the cache root.
SECRET_FILE = Path("index") / "record-secret"
_BYTES = 32


def record_secret(root: Path, *, create: bool) -> bytes | None:
    """The secret of the cache at ``root``; made first when missing and ``create`` is true.

    Two builds making it at once agree: each writes its own under a temporary name and links it
    into place only if none is there yet, then both read what is in place.

    Returns:
        The secret, or None when there is none and ``create`` is false (a read-only cache).
    """
    path = root / SECRET_FILE
    found = _read(path)
    if found is not None or not create:
        return found
    damaged = path.exists()
    if damaged:
        log.warning(
            "replacing the damaged record secret %s (records made with it read as changed)", path
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        if damaged:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):  # another build's is in place: read it
                os.link(tmp, path)  # never replaces a secret already in place
    finally:
        tmp.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return data if len(data) == _BYTES else None
