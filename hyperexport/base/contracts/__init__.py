"""Records that flow between stages: plain data, no torch."""
