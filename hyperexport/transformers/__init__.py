"""transformers support, public home: ``kv_layers`` and ``static_cache`` (the README's Library
section), and the names published models record (``seq2seq_layers``). The code is in
:mod:`hyperexport.library.transformers`. Nothing is imported here.
"""
