"""obstore's errors as the built-in exceptions a caller catches, naming the object's URL.

obstore's exceptions carry a long debug dump and name the path relative to the store.
:func:`translate` turns them into the built-in type a user catches (``FileNotFoundError``,
``PermissionError``, ``ConnectionError``, ``TimeoutError``, ``ValueError``) with a one-line
message naming the full URL of the object, and keeps obstore's error as the cause. Every URL
in a message passes through :func:`~aioload.urls.redact_url` first: a password in a URL's
userinfo is shown as ``***``. :func:`is_transient` tells which of them are worth retrying.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import obstore.exceptions

from aioload.stats.throttles import note_throttle
from aioload.urls import redact_url

__all__ = ["error_summary", "is_transient", "raise_translated", "redact_error", "translate"]

_THROTTLES = (429, 503)  # "too many requests", "slow down" (S3's 503 SlowDown)
_STATUS = re.compile(r"status code: (\d{3})")
_TIMEOUT = re.compile(r"timed out|TimedOut|deadline has elapsed", re.IGNORECASE)
_CONNECT = re.compile(
    r"error sending request|connect|connection (reset|closed|refused)|broken pipe",
    re.IGNORECASE,
)


def redact_error(error: BaseException) -> BaseException:
    """``error`` with the URL passwords in its message hidden, for the traceback of its chain.

    obstore's messages (and their debug dump) name URLs as given, so that a
    traceback showing obstore's error as the cause would show the password.
    Changes ``error`` itself, and returns it.

    Example::

        >>> redact_error(ValueError("GET http://u:hunter2@127.0.0.1:9/a failed")).args
        ('GET http://u:***@127.0.0.1:9/a failed',)
    """
    error.args = tuple(redact_url(a) if isinstance(a, str) else a for a in error.args)
    return error


def error_summary(error: BaseException) -> str:
    """obstore's message of ``error`` on one line, without its debug dump and the XML body of
    the server's answer, passwords in URLs hidden, at most 400 characters.

    Example::

        >>> error_summary(OSError("Generic S3 error: status code: 503\\n\\nDebug source: ..."))
        'Generic S3 error: status code: 503'
    """
    text = str(error).split("\n\nDebug source:", 1)[0]
    text = text.split(": <?xml", 1)[0]
    text = redact_url(" ".join(text.split()))  # obstore names the endpoint's URL as given
    return text if len(text) <= 400 else text[:397] + "..."


def translate(error: BaseException, where: str) -> BaseException:
    """The exception to raise for obstore's ``error`` while reading ``where`` (a full URL).

    The type is the built-in one a caller expects, the message starts with the
    object's URL, and the attributes ``url``, ``status`` (the HTTP status, or
    None), ``throttled`` (the store said slow down: 503, 429) and ``retry_after``
    (the seconds its ``Retry-After`` asked for; None: obstore does not tell, and the
    fault policy's jittered backoff applies) are set; a throttled read is counted
    (:mod:`aioload.stats.throttles`), for ``concurrency="auto"``; the message and
    ``url`` show a password in the URL's userinfo as ``***``, and so does ``error``
    from then on (it is the cause that tracebacks show):

    - missing object or bucket (404): ``FileNotFoundError``
    - denied or unauthenticated (401, 403): ``PermissionError``
    - a byte range outside the object (416), an invalid path: ``ValueError``
    - a timeout, after obstore's retries: ``TimeoutError``
    - a server error (5xx, 429) or a refused, reset or failed connection,
      after obstore's retries: ``ConnectionError``
    - anything else: ``OSError``

    Non-obstore errors are returned unchanged.
    """
    if not isinstance(error, obstore.exceptions.BaseError | FileNotFoundError):
        return error
    redact_error(error)  # it stays the cause of the translated error
    where = redact_url(where)
    text = error_summary(error)
    match = _STATUS.search(text)
    status = int(match.group(1)) if match else None
    kind: type[Exception]
    if isinstance(error, FileNotFoundError) or status == 404:
        kind, what = FileNotFoundError, "no such object"
    elif isinstance(
        error,
        obstore.exceptions.PermissionDeniedError | obstore.exceptions.UnauthenticatedError,
    ) or status in (401, 403):
        kind, what = PermissionError, "access denied"
    elif status == 416:
        kind, what = ValueError, "byte range outside the object"
    elif isinstance(error, obstore.exceptions.InvalidPathError):
        kind, what = ValueError, "invalid path"
    elif status is not None and (status >= 500 or status == 429):
        kind, what = ConnectionError, f"server error (HTTP {status})"
    elif _TIMEOUT.search(str(error)):  # obstore says so only in its debug dump
        kind, what = TimeoutError, "timed out"
    elif status is None and _CONNECT.search(text):
        kind, what = ConnectionError, "cannot reach the server"
    else:
        kind, what = OSError, "request failed"
    translated: Any = kind(f"{where}: {what}: {text}")
    translated.url = where
    translated.status = status
    translated.throttled = status in _THROTTLES
    translated.retry_after = None
    if translated.throttled:
        note_throttle()
    return translated  # type: ignore[no-any-return]


def raise_translated(error: BaseException, where: str) -> NoReturn:
    """Raises :func:`translate`'s exception for ``error``, chained to it (or ``error`` itself)."""
    translated = translate(error, where)
    if translated is error:
        raise error
    raise translated from error


def is_transient(error: BaseException) -> bool:
    """Whether a read that failed with ``error`` is worth another attempt.

    True for timeouts, connection errors and server errors (5xx, 429 — obstore
    already retried them); False for a missing object, a denied request, a bad
    range and other 4xx answers. Use it as the loader's retry predicate for a
    second line of retries above obstore's::

        DataLoader(dataset, retry=RetryPolicy(attempts=3, retry_on=is_transient))
    """
    return isinstance(error, ConnectionError | TimeoutError)
