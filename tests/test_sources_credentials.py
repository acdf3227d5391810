"""Where an S3 store's credentials come from: a VM's role only when allowed, AWS profiles.

Nothing here leaves 127.0.0.1: the instance-metadata service is a stand-in on 127.0.0.1
(``metadata_service``, which obstore and botocore are pointed at), the store is the local
SeaweedFS server, and AWS profiles live in files of the test's own folder.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import obstore
import pytest
from servers import MetadataService

from aioload import DataLoader
from aioload.sources import ObjectDataset, open_store

PAYLOAD = b"read with someone's credentials"


def _put(s3_prefix: str, options: dict[str, Any]) -> None:
    store, prefix = open_store(s3_prefix + "/", storage_options=options)
    obstore.put(store, prefix + "a.bin", PAYLOAD)


def _where(options: dict[str, Any]) -> dict[str, Any]:
    """The store's endpoint and region alone: no credentials."""
    return {"endpoint": options["endpoint"], "region": options["region"]}


def _profiles(folder: Path, monkeypatch: pytest.MonkeyPatch, keys: tuple[str, str]) -> None:
    """AWS config files in ``folder``: profile ``dev`` with ``keys``, ``empty`` with none."""
    (folder / "config").write_text(
        "[profile dev]\nregion = us-east-1\n\n[profile empty]\nregion = us-east-1\n"
    )
    (folder / "credentials").write_text(
        f"[dev]\naws_access_key_id = {keys[0]}\naws_secret_access_key = {keys[1]}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(folder / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "credentials"))


def test_the_vm_role_is_asked_for_only_with_metadata_credentials(
    metadata_service: MetadataService, s3_prefix: str, s3_storage_options: dict[str, Any]
) -> None:
    _put(s3_prefix, s3_storage_options)
    with pytest.raises(ValueError, match="no credentials"):
        ObjectDataset(s3_prefix + "/", ["a.bin"], storage_options=_where(s3_storage_options))
    assert metadata_service.requests == []  # refused before any request
    allowed = {**_where(s3_storage_options), "metadata_credentials": True}
    dataset = ObjectDataset(s3_prefix + "/", ["a.bin"], storage_options=allowed)
    assert asyncio.run(dataset["a.bin"]) == PAYLOAD
    assert ("GET", "/latest/meta-data/iam/security-credentials/role") in metadata_service.requests


def test_an_aws_profile_without_boto3_names_what_reads_it(
    metadata_service: MetadataService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "dev")
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 fails
    with pytest.raises(ValueError, match="AWS_PROFILE='dev'") as raised:
        open_store("s3://bucket/", storage_options={"endpoint": "http://127.0.0.1:9"})
    message = str(raised.value)
    assert "obstore reads no AWS profiles" in message
    assert "obstore.auth.boto3.Boto3CredentialProvider" in message
    assert "pip install 'aioload-data[aws]'" in message
    assert metadata_service.requests == []


def test_credentials_given_otherwise_win_over_an_aws_profile(
    metadata_service: MetadataService,
    monkeypatch: pytest.MonkeyPatch,
    s3_prefix: str,
    s3_storage_options: dict[str, Any],
) -> None:
    # As in the AWS command line: keys in the options (or the environment) are used, and
    # the profile (here one that exists nowhere) is not even looked up.
    _put(s3_prefix, s3_storage_options)
    monkeypatch.setenv("AWS_PROFILE", "nowhere")
    monkeypatch.setitem(sys.modules, "boto3", None)
    dataset = ObjectDataset(s3_prefix + "/", ["a.bin"], storage_options=s3_storage_options)
    assert asyncio.run(dataset["a.bin"]) == PAYLOAD
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_storage_options["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_storage_options["secret_access_key"])
    dataset = ObjectDataset(s3_prefix + "/", ["a.bin"], storage_options=_where(s3_storage_options))
    assert asyncio.run(dataset["a.bin"]) == PAYLOAD
    assert metadata_service.requests == []


@pytest.mark.timeout(60)
def test_an_aws_profile_is_read_through_boto3(
    metadata_service: MetadataService,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    s3_prefix: str,
    s3_storage_options: dict[str, Any],
) -> None:
    pytest.importorskip("boto3")
    _put(s3_prefix, s3_storage_options)
    _profiles(tmp_path, monkeypatch, metadata_service.keys)
    monkeypatch.setenv("AWS_PROFILE", "dev")
    options = {"endpoint": s3_storage_options["endpoint"]}  # the region is the profile's
    dataset = ObjectDataset(s3_prefix + "/", ["a.bin"], storage_options=options)
    assert asyncio.run(dataset["a.bin"]) == PAYLOAD
    # A worker process builds its own store, from the same profile.
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    assert list(loader) == [PAYLOAD]
    assert metadata_service.requests == []


def test_an_aws_profile_never_asks_the_vm_role_unless_allowed(
    metadata_service: MetadataService,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    s3_prefix: str,
    s3_storage_options: dict[str, Any],
) -> None:
    pytest.importorskip("boto3")
    _put(s3_prefix, s3_storage_options)
    _profiles(tmp_path, monkeypatch, metadata_service.keys)
    monkeypatch.setenv("AWS_PROFILE", "missing")
    with pytest.raises(ValueError, match=r"the AWS profile 'missing'.*not in the AWS config"):
        open_store("s3://bucket/", storage_options=_where(s3_storage_options))
    monkeypatch.setenv("AWS_PROFILE", "empty")  # a region, and no credentials
    with pytest.raises(ValueError, match=r"'empty' \(AWS_PROFILE\) names neither keys"):
        ObjectDataset(s3_prefix + "/", ["a.bin"], storage_options=_where(s3_storage_options))
    assert metadata_service.requests == []
    # With metadata_credentials, the profile's chain ends at the VM's role, as boto3's does.
    allowed = {**_where(s3_storage_options), "metadata_credentials": True}
    dataset = ObjectDataset(s3_prefix + "/", ["a.bin"], storage_options=allowed)
    assert asyncio.run(dataset["a.bin"]) == PAYLOAD
    assert metadata_service.requests
