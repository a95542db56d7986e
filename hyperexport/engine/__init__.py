"""The build engine: the stage protocol, keys and hashing, the content-addressed cache (store,
entries, remote tier), locks, workspaces, discovered dependencies, the code closure and the
runner.

It is generic: it runs the stages it is handed with the settings it is handed, and imports
nothing of the exporter, the recipe schema, the checks or the reports
(``tests/test_layering.py``). Nothing in it imports torch or onnx: a no-op build (every stage a
cache hit) must stay fast and must not load them.
"""
