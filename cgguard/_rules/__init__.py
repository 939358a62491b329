"""The rules as data: which exist, what a capture looks like to them, which an attempt breaks.

``table`` (one record per rule), ``record`` (a capture's record, the cause of a refusal, how a
capture ends, the entry points' names), ``checks`` (the rules broken, as plain functions),
``exempt_syntax`` and ``exempt_match`` (exemptions written, and matched against a stack).

Imports cgguard._support, cgguard._errors."""
