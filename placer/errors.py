class PlacerError(ValueError):
    """A user-facing error: caught once at the CLI boundary, printed as one line, exit 1."""
