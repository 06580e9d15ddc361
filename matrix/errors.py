"""Errors a user caused and can fix: the CLI prints the message alone and exits 2."""


class InputError(Exception):
    pass


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the finished cells are reported, nothing is left running."""


def raise_terminated(signum, frame) -> None:
    raise Terminated()


MAX_ERROR_LINE = 600  # the runtime's words, not its whole log: the process's log keeps the rest


def error_line(error: BaseException, limit: int = MAX_ERROR_LINE) -> str:
    """An exception as the one line a cell or a step reports: its type and its words, whitespace folded."""
    text = " ".join(str(error).split())
    if len(text) > limit:
        text = text[:limit] + " …"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
