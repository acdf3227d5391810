"""The fault policy: retries with backoff, item timeouts, skipping items that fail for good.

Its one job: what happens when reading an item fails, decided once (a ``FaultPolicy``) and
applied by one retry loop (a ``Retrier``) where items are read, map-style or streamed.

Modules:

- ``policy``: ``FaultPolicy``, ``RetryPolicy``, ``SkippedItem`` and the epoch's ``SkipLog``;
- ``retrier``: ``Retrier``, the one retry loop, and its ``Skip`` markers;
- ``guard``: ``StreamGuard``, the policy as a stream applies it (``can_guard``,
  ``check_stream_policy``).

Used by the reader (:mod:`aioload.read`), the pipeline, and the stream datasets of
:mod:`aioload.sources` (``StreamGuard``, ``Skip``). The public names are exported by
:mod:`aioload`; nothing is re-exported here.
"""
