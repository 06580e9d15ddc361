"""Errors a user caused and can fix: the CLI prints the message alone and exits 2."""


class InputError(Exception):
    pass
