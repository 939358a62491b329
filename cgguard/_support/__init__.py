"""Leaf helpers every layer uses, standard library only.

``warn`` (one stderr line, never an exception), ``text`` (names from elsewhere made safe to
show), ``threads`` (a thread as captures remember it), ``frames`` (stack snapshots on the
capture path, and ``Stack``: a violation's stack resolved once), ``patchset`` (the one way to
replace attributes and put them back), ``typecheck`` (a parsed value against a TypedDict).

Imports nothing of cgguard outside this folder."""
