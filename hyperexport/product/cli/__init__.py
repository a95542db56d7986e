"""Command-line commands: the build (``build``), and subcommands ``python -m hyperexport <command>``."""
