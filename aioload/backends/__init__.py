"""Backends: where a batch is read, and how its outcome comes back to the epoch.

Its one job: run the batches an epoch hands out — on the loader's loop (``inline``), in
worker processes (``processes``) or as tasks of an executor (``executor``) — each through
the one batch reader of :mod:`aioload.read`, and deliver each outcome to the epoch's sink.

Modules:

- ``base``: the contract (``Backend``, ``BackendFactory``, ``OutcomeSink``; ``Outcome``
  from :mod:`aioload.read.outcome`);
- ``factory``: ``Backends``, which picks and builds the backend of each epoch and owns the
  persistent pool;
- ``inline``: ``InlineBackend`` (``num_workers=0``) and its fetch threads;
- ``processes``: the worker processes (a package: the backend, the pool, how workers
  start, the setup parcel, the wire);
- ``executor`` + ``executor_task``: ``ExecutorBackend`` and what runs in the executor;
- ``threads``: blocking work off the loop, its result back on the loop.

Used by the pipeline: ``Backend``, ``BackendFactory``, ``Backends``, ``check_executor``,
``executor_size``, ``THREADS_FOR_THREAD_SAFE``; by the face: ``check_script_for_workers``.
Nothing is re-exported here: import each name from its module.
"""
