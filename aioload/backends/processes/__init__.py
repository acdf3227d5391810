"""The process backend (``num_workers > 0``): worker processes, their start and their wire.

Modules:

- ``backend``: ``ProcessBackend``, the epoch's side of the workers;
- ``pool``: ``WorkerPool``, starting, replacing and stopping workers (``exit_began``);
- ``worker``: what runs inside a worker process (``worker_main``);
- ``start_method`` + ``fork_template`` + ``main_module``: how workers start, the rule in
  one place (``worker_start``, ``wait_until_gone``; the script's guard and names);
- ``setup_parcel`` + ``pickling``: the setup pickled once, its arrays shared;
- ``wire``: the commands and results between loader and workers, an outcome's wire form.

Used by the pipeline: ``exit_began``, ``wait_until_gone``, ``main_defined``,
``runs_main``; by the face: ``check_script_for_workers``.

Before the layout this path was one module (now ``backend``): its names still resolve
here, on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
