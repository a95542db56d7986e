"""Values of the engine's settings that whoever configures a build validates against.

A module of its own, importing nothing: a settings schema that checks the remote's mode does
not load the remote tier (nor put its code into the keys of the stages that load the schema).
"""

from __future__ import annotations

#: How a build uses the remote tier: read and upload (the default), or read only.
REMOTE_MODES = (READ_WRITE, READ_ONLY) = ("read_write", "read_only")
