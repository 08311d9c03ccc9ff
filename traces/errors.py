class TraceError(ValueError):
    """Bad trace input: a missing or empty corpus, a trace of another model, a bad schema."""


def first_line(exc: BaseException, limit: int = 120) -> str:
    """The first line of a library's message, cut to `limit` characters (never its multi-line
    explanation inside placer's one error line), or the exception's type name."""
    text = str(exc).strip()
    return (text.splitlines()[0][:limit] if text else "") or type(exc).__name__
