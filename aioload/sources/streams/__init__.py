"""The stream engine the three stream datasets share (tar shards, JSON lines, Parquet rows).

Its one job: what a stream dataset is apart from its format — the unit order of an epoch,
the split between ranks and workers, the checkpoint state and its checks, re-splitting
what states have left, interleaving units, and reading under the fault policy.

Modules:

- ``dataset``: ``StreamDataset``, the one base (argument checks, ``set_epoch``, the plan,
  ``state_dict`` / ``load_state_dict``, ``merge_states``, pickling);
- ``split``: ``Segment`` and the split by samples between ranks and workers;
- ``state``: ``Run``, ``Ref``, ``StreamState``, ``check_state``, ``resplit``
  (``ShardStateError`` is :class:`aioload.errors.ShardStateError`);
- ``checks``: what a state must hold true as a whole (``check_spans``);
- ``tracked``: one worker's tracked stream (``OpenRun``, ``reread``, ``resumed_stream``);
- ``interleave``: several units read at once, their samples taken in turn;
- ``faults``: a stream's runs under the fault policy (``guarded_runs``, ``decoded``);
- ``resume``: which ranks a set of states is shared over, and merging every rank's state.

Used by :mod:`aioload.sources.tar`, :mod:`aioload.sources.jsonl` and
:mod:`aioload.sources.parquet`. Nothing is re-exported here.
"""
