"""Copy-on-write file cloning: reflink where the filesystem allows, a plain copy otherwise.

Published outputs and checkouts of cached files are clones of the cache's blobs, so a
filesystem with reflinks (XFS, Btrfs, APFS via ``cp -c``) stores the artifact once; without
them a build copies a large blob out once (``workspace.py``). Hard links are never used: onnx
refuses to load external data with more than one link ("potential hardlink attack"), and a
hard-linked output edited in place would corrupt the cache. Nor are symlinks, for files a model
reads as external data: onnx refuses them, and onnx_ir and ONNX Runtime refuse one that leaves
the model's folder.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_reflink_failed_once = False


def clone_or_copy(src: Path, dst: Path) -> str:
    """Write ``dst`` as a reflink of ``src`` when possible, else as a copy.

    ``dst`` must not exist (callers write to a temporary name and rename). Returns ``"reflink"``
    or ``"copy"``; the first fallback in a process is logged at DEBUG with its cause (most
    filesystems, ext4 and tmpfs among them, have no reflinks: that is expected, not a fault).
    """
    global _reflink_failed_once
    if hasattr(fcntl, "ioctl"):
        with open(src, "rb") as fin, open(dst, "xb") as fout:
            try:
                fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
                return "reflink"
            except OSError as e:
                if not _reflink_failed_once:
                    log.debug("no reflink from %s (%s); copying", src.parent, e)
                    _reflink_failed_once = True
        os.unlink(dst)
    shutil.copyfile(src, dst)
    return "copy"
