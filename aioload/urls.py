"""Hiding the credentials of URLs in everything aioload prints.

A URL may carry credentials in its userinfo (``https://user:secret@host/``,
an S3 ``--endpoint``); reprs, error messages and the command line show such
URLs as ``https://user:***@host/``. This module imports nothing beyond the
standard library, so that every part of aioload can use it.
"""

from __future__ import annotations

import re

__all__ = ["redact_url"]

# A scheme, "://", then the authority up to its last "@": a greedy run of characters that
# cannot end an authority (nor the quotes and brackets around a URL in a message).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s'\"<>`]*)@")


def _hide(match: re.Match[str]) -> str:
    user, colon, _ = match.group("userinfo").partition(":")
    # Without a password the name itself is the secret (a token used as the user name).
    return f"{match.group('scheme')}{user}:***@" if colon else f"{match.group('scheme')}***@"


def redact_url(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with the passwords of their userinfo hidden.

    ``user:password@`` becomes ``user:***@``; a user name alone
    (``https://token@host/``) becomes ``***@``. Everything else is kept, and
    redacting twice changes nothing.

    Example::

        >>> redact_url("http://user:secret@127.0.0.1:8000/train-0001.tar")
        'http://user:***@127.0.0.1:8000/train-0001.tar'
        >>> redact_url("s3://bucket/x: cannot reach https://token@host/ (ConnectionError)")
        's3://bucket/x: cannot reach https://***@host/ (ConnectionError)'
    """
    if "@" not in text:
        return text
    return _USERINFO.sub(_hide, text)
