"""Memory outside the Python heap: shared-memory segments and page-locked buffers.

Its one job: the bytes of batches that cross a process or go to a GPU without a copy
too many.

Modules:

- ``segments``: the shared-memory transport of worker results (``SegmentWriter``,
  ``SegmentReader``, ``Arena``, ``shared_memory_fd``);
- ``pinned``: page-locked host memory for ``pin_memory=True`` (``PinnedBufferPool``,
  ``pin_batch``, ``torch_pins``);
- ``buffers``: what both share: size classes and the ``Lease`` of a mapping.

Used by the backends (segments) and the pipeline's pin stage (pinned). Nothing is
re-exported here: import each name from its module.
"""
