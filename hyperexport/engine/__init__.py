"""The build engine: the stage protocol, keys and hashing, the content-addressed cache (store,
entries, remote tier), locks, workspaces, discovered dependencies, the code closure, the
runner, and the cache's maintenance (inventory, verify, collector, push and pull).

It is generic: it runs the stages it is handed with the settings it is handed, keys the code
of the package it is handed (:class:`~.code_closure.CodePackage`), and imports nothing outside
itself but the standard library, ``filelock`` and (for a remote tier) ``fsspec``. It speaks of
stages, actions, keys and entries, raises its own errors (:mod:`.errors`), and could ship as
its own distribution. A no-op build (every stage a cache hit) loads none of the libraries the
stages run.
"""
