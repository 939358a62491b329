"""What a run has seen, as values: ``schema`` (the events' and the report's types), ``site``
(the base of every count kept per site), ``ledger`` (violations and exempted captures per
site, and the ``Run``), ``census`` (captures and torch.compile's skips per site) and
``census_merge`` (a job's censuses merged).

Imports cgguard._rules and below."""
