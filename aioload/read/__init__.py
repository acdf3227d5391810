"""Reading one batch, the same way wherever it runs: fetch, fault policy, collate, outcome.

Its one job: whatever runs a batch (the inline backend, a worker process, an executor
task) calls one ``BatchReader``, which reads the keys (or a stream's next samples),
applies the fault policy, collates, and returns one frozen ``Outcome``.

Modules:

- ``reader``: ``BatchReader`` and ``WorkerSetup`` (what a worker is given);
- ``fetch``: which protocol a dataset speaks (``DatasetProtocol``, ``inspect_dataset``),
  and the ``Fetcher`` / ``GuardedFetcher`` of map-style reads;
- ``streams``: ``StreamReader``, an iterable dataset's batches, guarded or not;
- ``eager``: ``ItemPool``, many item coroutines in flight on one loop;
- ``tuning``: ``ConcurrencyTuner`` and ``AutoConcurrency``, ``concurrency="auto"``'s
  controller of an ``ItemPool``'s limit;
- ``outcome``: ``Outcome``, what reading one batch came to.

Used by the backends: ``BatchReader``, ``WorkerSetup``, ``ItemPool``, ``Outcome``,
``inspect_dataset``, ``AutoConcurrency``. Nothing is re-exported here: import each name
from its module.
"""
