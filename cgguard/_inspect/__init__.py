"""Inspection, opt-in: each capture watched op by op, and each replay checked for inputs that
died."""
