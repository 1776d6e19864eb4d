"""The pytest plugin (start-method passes, leak checks) and the longest-first xdist scheduler."""
