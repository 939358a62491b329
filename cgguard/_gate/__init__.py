"""The gate: may a capture begin now. cgguard's capture flag, the flags it follows, capture
windows and the built-in profiles."""
