"""Command-line subcommands other than the build itself (``python -m hyperexport <command>``)."""
