"""transformers support: export patches, the attention op and its registration, static KV cache.

Importing this package has no side effect; every registration and patch is a context manager.
"""
