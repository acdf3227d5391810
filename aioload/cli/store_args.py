"""The store flags every command that reads a store takes, and what they become.

``--endpoint``, ``--region``, ``--anonymous`` and ``--metadata-credentials``
(:func:`add_store_arguments`) become the ``storage_options`` of
:func:`~aioload.sources.open_store` (:func:`store_options`), checked against the URLs'
schemes; :func:`check_credentials` fails, before any request, with the environment
variables a shell user sets when a cloud URL has no credentials.

Credentials otherwise come from the environment, as for the AWS command line: the
``AWS_*`` variables, or ``AWS_PROFILE`` (read through boto3: ``pip install
'aioload-data[aws]'``). A cloud VM's own role (its instance-metadata service) is used only
with ``--metadata-credentials``: off a cloud VM that lookup would hang on a link-local
address before failing.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from aioload.cli import EXIT_CODES, CommandError
from aioload.urls import redact_url

__all__ = ["add_store_arguments", "check_credentials", "store_options"]

_CLOUD = ("s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure")

# What the CLI user sets where aioload.sources would name its Python options.
_CREDENTIALS_HINT = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (a service-account key file)",
    "az": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY)",
}
_KIND = {"s3a": "s3", "abfs": "az", "abfss": "az", "adl": "az", "azure": "az"}


def add_store_arguments(parser: argparse.ArgumentParser, *, reads: str = "read") -> None:
    """Adds ``--endpoint``, ``--region``, ``--anonymous`` and ``--metadata-credentials``."""
    parser.add_argument("--endpoint", help="the store's endpoint, e.g. http://127.0.0.1:8333")
    parser.add_argument("--region", help="the store's region")
    parser.add_argument(
        "--anonymous", action="store_true", help=f"unsigned requests ({reads} public data)"
    )
    parser.add_argument(
        "--metadata-credentials",
        action="store_true",
        help="on a cloud VM: take credentials from its instance-metadata service (its role)",
    )


def store_options(arguments: argparse.Namespace, urls: Sequence[str]) -> dict[str, Any]:
    """The store options the flags give, for stores of ``urls``.

    Raises:
        CommandError: a flag that does not apply to one of the URLs' schemes (exit code 2).
    """
    options: dict[str, Any] = {}
    schemes = sorted({urlsplit(url).scheme.lower() for url in urls})
    if arguments.endpoint:
        other = [scheme for scheme in schemes if scheme not in _CLOUD]
        if other:
            raise CommandError(
                f"--endpoint applies to s3://, gs:// and az:// URLs, not {other[0]}://", 2
            )
        options["endpoint"] = arguments.endpoint
    if arguments.region:
        if any(scheme not in ("s3", "s3a") for scheme in schemes):
            raise CommandError("--region applies to s3:// URLs", 2)
        options["region"] = arguments.region
    if arguments.anonymous:
        other = [scheme for scheme in schemes if scheme not in _CLOUD]
        if other:
            raise CommandError(f"--anonymous applies to cloud URLs, not {other[0]}://", 2)
        options["skip_signature"] = True
    if arguments.metadata_credentials:
        other = [scheme for scheme in schemes if scheme not in _CLOUD]
        if other:
            raise CommandError(
                f"--metadata-credentials applies to cloud URLs, not {other[0]}://", 2
            )
        options["metadata_credentials"] = True
    return options


def check_credentials(url: str, options: dict[str, Any]) -> None:
    """Fails with the variables and flags a shell user sets when a cloud URL has no credentials.

    It opens the store (no request is sent) as the dataset would; the check is the one of
    :func:`aioload.sources.open_store`, whose message names its Python options.
    """
    from aioload.sources import expand_urls, open_store

    scheme = urlsplit(url).scheme.lower()
    kind = _KIND.get(scheme, scheme)
    if kind not in _CREDENTIALS_HINT:
        return
    try:
        open_store(expand_urls(url)[0] if "{" in url else url, storage_options=options)
    except ValueError as error:
        if "no credentials" not in str(error):
            raise
        raise CommandError(
            f"{redact_url(url)}: no credentials: set {_CREDENTIALS_HINT[kind]} in the "
            "environment, pass --anonymous to read public data unsigned, or "
            "--metadata-credentials on a cloud VM to use its role",
            EXIT_CODES["usage"],
        ) from error
