"""The rules as data: the rule table, the checks over capture records, the exemptions' syntax
and their matching."""
