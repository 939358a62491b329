"""Leaf helpers every layer uses: warnings, text made safe, threads, stack snapshots, the
patch set. Standard library only."""
