"""The base: the records that flow between stages (``contracts/``), typed errors, exit codes,
atomic writes, the default cache folder, and the version facts. Everything above may import it;
it imports only the engine's error bases and files below it (``tests/test_layering.py``).

This ``__init__`` imports nothing: ``python -m hyperexport`` loads ``exit_codes`` and
``cache_dir`` from here before it enters the keyed loader."""
