class TraceError(ValueError):
    """Bad trace input: a missing or empty corpus, a trace of another model, a bad schema."""
