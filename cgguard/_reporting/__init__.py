"""What a violation does once found: the reporter, the events it builds, the log, the report file
and the metrics."""
