"""Errors a user caused and can fix: the CLI prints the message alone and exits 2."""


class InputError(Exception):
    pass


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the finished cells are reported, nothing is left running."""


def raise_terminated(signum, frame) -> None:
    raise Terminated()
