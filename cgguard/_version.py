__version__ = "0.1.0"


def distribution_version(name: str) -> str | None:
    """The installed version of a distribution, or None; for reports about the environment."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
