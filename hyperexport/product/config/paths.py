"""Where conf/, recipes/ and the default outputs live (repository or installed data)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def _data_root() -> Path:
    """Where conf/ and recipes/ are: the repository (editable install, checkout), else the
    ``share/hyperexport`` folder a regular install puts them in (see pyproject's data-files)."""
    if (REPO_ROOT / "conf" / "config.yaml").is_file():
        return REPO_ROOT
    import sys

    return Path(sys.prefix) / "share" / "hyperexport"


CONF_DIR = _data_root() / "conf"


RECIPES_DIR = _data_root() / "recipes"

#: The recipe a build uses without ``recipe=``: conf/config.yaml's default of the ``recipe``
#: group (tests/product/config holds the two together).
DEFAULT_RECIPE = "tiny_llama"


# In a checkout (editable install) the outputs go to <repo>/outputs; a regular install has no
# repository, so they go to a per-user directory instead (never the working directory).
DEFAULT_OUTPUTS_DIR = (
    REPO_ROOT / "outputs"
    if _data_root() == REPO_ROOT
    else Path.home() / ".local" / "share" / "hyperexport" / "outputs"
)
