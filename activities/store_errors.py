"""The one error every store raises when it cannot be opened, apart from the stores themselves so
that `conductor` can name it without importing them (a command that opens no store starts sooner)."""


class StoreUnavailable(RuntimeError):
    """The configured store cannot be opened (unreachable, refused login, missing file); one line, redacted."""
