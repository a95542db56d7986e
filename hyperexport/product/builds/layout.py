"""Names of the outputs folder's layout (``outputs/README.md``): where publications live and what
marks a failed build or a publication being written.
"""

from __future__ import annotations

#: The folder of every publication of a recipe: ``<outputs>/<recipe>/.builds/<variant>.<id>/``.
BUILDS = ".builds"
#: ``<variant>.failed``: the link to the last failed build.
FAILED_SUFFIX = ".failed"
#: ``<publication>.lock``: held (filelock) while that publication is written.
LOCK_SUFFIX = ".lock"
