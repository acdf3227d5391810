"""Finding every process a test started, by a mark in its environment.

A test puts ``NAME=mark`` in the environment of what it runs; every process
started from there inherits it (fork servers, workers, their replacements), so
scanning ``/proc`` finds them all, however they were started.
"""

from __future__ import annotations

from pathlib import Path


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, already dead, does not)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZXx"


def marked_processes(variable: str, mark: str) -> list[int]:
    """The running processes whose environment holds ``variable=mark``."""
    needle = f"{variable}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and running(int(entry.name)):
            found.append(int(entry.name))
    return found
