"""What a run has seen: the events' and the report's schema, the ledger of violations, the
census's counts, and the census merged across a job's reports."""
