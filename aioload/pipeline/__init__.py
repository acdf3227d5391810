"""The loader's pipeline: one epoch from the sampler's keys to the consumer's batches.

Its one job is the epoch itself: numbering batches, the window of batches in flight,
reordering, the hand-off to the consumer (``async for`` on the caller's loop, or ``for``
through a loop thread), the pin thread, and the checkpoint of what the consumer received.
Where a batch is read is the backends' (:mod:`aioload.backends`), one floor down.

Modules:

- ``assembly``: ``EpochAssembly``, each epoch made from the loader's settings;
- ``scheduler``: ``Epoch``, the sequence numbers, the ``Window``, reordering;
- ``iteration``: ``AsyncBatchIterator`` and ``SyncBatchIterator``, over one driver;
- ``handoff``: how finished batches reach the consumer, on the loop or in another thread;
- ``pin_stage``: the thread that pins each batch (over :mod:`aioload.memory`);
- ``received``: what the consumer has taken out, the record a checkpoint is made of;
- ``checkpoint``: ``Checkpoints``, the loader's states, and ``EpochPlan`` (where an epoch
  starts), which the backends' factory reads;
- ``notebook``: whether the running loop is an IPython kernel's.

Used by the face (:mod:`aioload.loader`): ``Epoch``, ``AsyncBatchIterator``,
``SyncBatchIterator``, ``Checkpoints``, ``Pinner``, ``check_arguments``, ``window_size``.
Nothing is re-exported here: import each name from its module.
"""
