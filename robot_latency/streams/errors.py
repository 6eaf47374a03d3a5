"""Errors raised by the command-stream readers and writers."""


class StreamError(Exception):
    """A command stream that cannot be read or written; the message names the file and problem."""
