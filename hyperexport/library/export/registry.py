"""The export paths by the public ``dynamo`` flag: the one place a path is chosen."""

from __future__ import annotations

from hyperexport.base.errors import VersionsError
from hyperexport.base.versions import unsupported
from hyperexport.library.export.dynamo_path import DynamoPath
from hyperexport.library.export.path import ExportPath
from hyperexport.library.export.torchscript import TorchScriptPath

#: Every export path, by the ``dynamo`` flag value that selects it.
EXPORT_PATHS: dict[bool, ExportPath] = {False: TorchScriptPath(), True: DynamoPath()}


def path_for(dynamo: bool) -> ExportPath:
    """The export path that ``dynamo`` selects, once the installed libraries can serve it.

    Raises:
        VersionsError: A known-broken combination of installed versions for this path (one
            line naming both), before anything is captured or exported.
    """
    problems = unsupported(dynamo)
    if problems:
        raise VersionsError(problems[0])
    return EXPORT_PATHS[dynamo]


def other_path(path: ExportPath) -> ExportPath:
    """The path a fallback retries on."""
    return EXPORT_PATHS[not path.dynamo]
