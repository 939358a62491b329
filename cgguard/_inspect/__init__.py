"""Inspection, opt-in: each capture watched op by op, and each replay checked for inputs that
died. ``inspector`` (the watcher and its captures), ``mode`` (the dispatch mode), ``liveness``
(a capture's external inputs), ``sync_ops`` (the ops that synchronize), ``rng`` (what torch
refuses of the CUDA generator during a capture).

Imports cgguard._core and below; never cgguard._census."""
