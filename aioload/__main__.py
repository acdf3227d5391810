"""``python -m aioload``: the command line (see :mod:`aioload.cli`)."""

from aioload.cli import main

raise SystemExit(main())
