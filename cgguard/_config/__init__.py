"""Configuration: the table of settings with the one parser of the environment, and ``Config``."""
