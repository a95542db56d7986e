"""The product: the command line (``cli/``), recipe builds on the engine (``builds/``), the
stages (``stages/``), the recipe schema (``config/``) and what a stage hands the library, made
from its recipe slice (``from_recipe/``). It imports the engine, the library and the base; none
of them imports it (``tests/test_layering.py``)."""
