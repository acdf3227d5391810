"""The fork template: a process forked while forking was safe, which forks workers on request.

Workers forked from the loader's process inherit whatever runs in it. Some
runtimes do not survive that: obstore's tokio threads (a worker forked after
the parent's first request hangs at its own), CUDA once torch has initialised
it. Where one of them runs, :mod:`aioload.backends.processes.start_method` starts the
workers from a :class:`ForkTemplate` instead: a process forked from the
loader's process earlier, before the runtime started, that forks one worker
per request. The template never runs the script again (it is a fork: its
``__main__`` is the script's, as it was then), so a script without an ``if
__name__ == "__main__":`` guard runs unchanged, and its workers start in
milliseconds.

How a worker starts from the template:

- the loader pickles the worker's ``Process`` object as ``forkserver`` does
  (the setup travels as a :class:`~aioload.backends.processes.setup_parcel.SetupParcel`:
  large arrays in one shared segment) into a ``memfd``, and sends it with the
  descriptors the pickle refers to (the worker's sockets, the segment) and a
  socket of its own for the answer, over the template's request socket
  (``SOCK_SEQPACKET``: one message per worker);
- the template forks; the child reads the pickle, takes the loader's working
  directory, environment and ``sys.path`` of the moment, and runs the
  ``Process`` as ``multiprocessing`` runs any child;
- the template writes the child's pid on the answer socket at once, and its
  exit status when the child ends (it is the child's parent, and reaps it):
  the answer socket is the worker's sentinel on the loader's side, as under
  ``forkserver``.

Classes and functions the workers receive are found by name in the template's
``__main__``, as it was when the template was forked: :meth:`ForkTemplate.fresh`
says whether the script's classes, functions and imported modules of then are
still the same objects (a notebook cell run again since makes it stale, and a
stale template is not used). Other globals of the script reach the template's
workers as they were then.

Lifetime: one template per process at most (:func:`current`), a daemonic
``multiprocessing`` child of the loader's process. It ends when that process
ends, however it ends (it waits on a pidfd of it), and at a normal exit with
the other daemonic children (after the worker pools have stopped). A template
that is replaced (:func:`replace`) stops taking requests and exits once its
last worker has ended. A process forked from the loader's (a worker, or any
child) forgets the template: it is not its own. The template is single-threaded
and keeps no queue: a request is served before the next is read.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.process
import os
import pickle
import re
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Iterable
from multiprocessing import popen_fork, reduction, util
from typing import Any, NoReturn

__all__ = ["ForkTemplate", "current", "replace"]

_SIGNED = struct.Struct("q")
_ANSWER_WITHIN = 30.0  # seconds the template gets to say a worker's pid
_MAX_FDS = 253  # SCM_MAX_FD: the most descriptors one message carries
_ORPHANS_WITHIN = 3.0  # seconds the workers get to end after the loader's process has
_NAME = "aioload-template"  # the template's process name (ps, /proc/PID/comm: 15 bytes)

# IPython's history names, rebound by every cell: not the script's own.
_HISTORY = re.compile(r"_{1,3}|_i{1,3}|_i?\d+|_(oh|ih|dh)")


def _main_snapshot() -> dict[str, object]:
    """The classes, functions and modules ``__main__`` binds now, by name."""
    main = sys.modules.get("__main__")
    if main is None:
        return {}
    return {
        name: value
        for name, value in list(vars(main).items())
        if isinstance(value, type | types.FunctionType | types.ModuleType)
        and not _HISTORY.fullmatch(name)
    }


def _write_signed(sock: socket.socket, value: int) -> None:
    with contextlib.suppress(OSError):  # the loader closed its end: nobody asks
        sock.sendall(_SIGNED.pack(value))


def _read_signed(fd: int) -> int:
    data = b""
    while len(data) < _SIGNED.size:
        chunk = os.read(fd, _SIGNED.size - len(data))
        if not chunk:
            raise EOFError("the fork template closed the worker's answer socket")
        data += chunk
    value: int = _SIGNED.unpack(data)[0]
    return value


def _comm() -> str:
    try:
        with open("/proc/self/comm") as file:
            return file.read().strip()
    except OSError:
        return ""


def _set_comm(name: str) -> None:
    if not name:
        return
    try:
        with open("/proc/self/comm", "w") as file:
            file.write(name[:15])
    except OSError:
        pass


# -- the loader's side ---------------------------------------------------------------


class _InheritedFd:
    """A descriptor that reached the worker with its start request (``DupFd``'s role)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        return _inherited[self.index]


class _TemplatePopen(popen_fork.Popen):
    """Starts one worker ``Process`` from the template (``multiprocessing``'s Popen role)."""

    method = "template"
    DupFd = _InheritedFd

    def __init__(self, process_obj: multiprocessing.process.BaseProcess, template: ForkTemplate):
        self._template = template
        self._fds: list[int] = []
        super().__init__(process_obj)

    def duplicate_for_child(self, fd: int) -> int:
        self._fds.append(fd)
        return len(self._fds) - 1

    def _launch(self, process_obj: multiprocessing.process.BaseProcess) -> None:
        payload = io.BytesIO()
        here = {"cwd": os.getcwd(), "environ": dict(os.environ), "sys_path": list(sys.path)}
        pickle.dump(here, payload, protocol=pickle.HIGHEST_PROTOCOL)
        multiprocessing.context.set_spawning_popen(self)  # type: ignore[arg-type]
        try:
            reduction.dump(process_obj, payload)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        self.pid, self.sentinel = self._template.fork(payload.getbuffer(), self._fds)
        self.finalizer = util.Finalize(self, os.close, (self.sentinel,))

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is None:
            timeout = 0 if flag == os.WNOHANG else None
            if not multiprocessing.connection.wait([self.sentinel], timeout):
                return None
            try:
                self.returncode = _read_signed(self.sentinel)
            except (OSError, EOFError):  # the template itself was killed
                self.returncode = 255
        return self.returncode


class _TemplateProcess(multiprocessing.process.BaseProcess):
    """A ``Process`` that the template forks (everything else is ``multiprocessing``'s)."""

    _start_method = None  # the child keeps the default context it inherits

    def __init__(self, template: ForkTemplate, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._template = template

    def _Popen(self, process_obj: multiprocessing.process.BaseProcess) -> _TemplatePopen:
        return _TemplatePopen(process_obj, self._template)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        state.pop("_template", None)  # the loader's end: not the worker's business
        return state


class TemplateContext(multiprocessing.context.BaseContext):
    """The ``multiprocessing`` context whose processes the template forks."""

    _name = "template"

    def __init__(self, template: ForkTemplate) -> None:
        self._template = template

    def Process(self, **kwargs: Any) -> _TemplateProcess:
        return _TemplateProcess(self._template, **kwargs)


class ForkTemplate:
    """The loader's end of a fork template (see the module docstring); forks it now.

    Example::

        template = ForkTemplate()          # forked now: call it while forking is safe
        process = template.context().Process(target=worker_main, args=(...), daemon=True)
        process.start()                    # forked by the template
    """

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._main = _main_snapshot()
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._process = multiprocessing.get_context("fork").Process(
            target=_serve,
            args=(theirs, ours, self.owner, _comm()),
            name="aioload-fork-template",
            daemon=True,
        )
        try:
            self._process.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._requests: socket.socket | None = ours

    @property
    def pid(self) -> int | None:
        """The template's pid."""
        return self._process.pid

    def alive(self) -> bool:
        """Whether the template takes requests (it is this process's, and runs)."""
        return (
            self._requests is not None
            and self.owner == os.getpid()
            and self._process.exitcode is None
        )

    def fresh(self) -> bool:
        """Whether every class, function and module ``__main__`` bound when the template
        was forked is still bound there, to the same object.

        A name rebound since (a class defined again, a notebook cell run again)
        would reach the template's workers as its old object: silently old
        code, so the template is stale. A name bound only since cannot be found
        in the template's ``__main__``: a worker that needs it fails with
        pickle's ``AttributeError`` or a ``NameError``, loud, so it is allowed.
        """
        now = _main_snapshot()
        return all(now.get(name) is value for name, value in self._main.items())

    def complete(self) -> bool:
        """Fresh, and ``__main__`` binds no class, function or module the template lacks."""
        now = _main_snapshot()
        return now.keys() == self._main.keys() and self.fresh()

    def has(self, names: Iterable[str]) -> bool:
        """Whether ``__main__`` bound each of ``names`` to its present object at the fork."""
        main = sys.modules.get("__main__")
        present = vars(main) if main is not None else {}
        return all(name in self._main and present.get(name) is self._main[name] for name in names)

    def context(self) -> TemplateContext:
        """The ``multiprocessing`` context that starts processes from this template."""
        return TemplateContext(self)

    def fork(self, payload: memoryview, fds: list[int]) -> tuple[int, int]:
        """Asks for a child running ``payload`` with ``fds``: its pid and its answer socket.

        Blocking (a few milliseconds: the template forks at once). The answer
        socket's descriptor is the caller's to close.
        """
        start = _payload_file(payload)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                requests = self._requests
                if requests is None or self.owner != os.getpid():
                    raise RuntimeError("aioload's fork template is closed")
                try:
                    socket.send_fds(requests, [b"W"], [theirs.fileno(), start, *fds])
                except OSError as error:
                    raise RuntimeError("aioload's fork template has ended") from error
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(start)
        try:
            if not multiprocessing.connection.wait([ours], _ANSWER_WITHIN):
                raise RuntimeError(
                    f"aioload's fork template did not start a worker in {_ANSWER_WITHIN:.0f} s"
                )
            try:
                pid = _read_signed(ours.fileno())
            except EOFError as error:
                message = "aioload's fork template ended while starting a worker"
                raise RuntimeError(message) from error
        except BaseException:
            ours.close()
            raise
        return pid, ours.detach()

    def close(self) -> None:
        """No more requests: the template exits once its last worker has ended."""
        with self._lock:
            requests, self._requests = self._requests, None
        if requests is not None:
            requests.close()

    def forget(self) -> None:
        """In a forked child: drops this process's copy, leaving the template to its owner."""
        requests, self._requests = self._requests, None
        if requests is not None:
            with contextlib.suppress(OSError):
                requests.close()


def _payload_file(payload: memoryview) -> int:
    """A descriptor of an anonymous file holding ``payload``, positioned at its start."""
    try:
        fd = os.memfd_create("aioload-worker-start", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # no memfd: an unlinked temporary file
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


_template: ForkTemplate | None = None
_template_lock = threading.Lock()


def current() -> ForkTemplate | None:
    """This process's fork template, if it has one that takes requests."""
    template = _template
    return template if template is not None and template.alive() else None


def replace() -> ForkTemplate:
    """Forks a new template now (call it while forking is safe); the old one retires."""
    global _template
    with _template_lock:
        old, _template = _template, ForkTemplate()
    if old is not None:
        old.close()
    return _template


def _forget_in_child() -> None:
    global _template
    template, _template = _template, None
    if template is not None:
        template.forget()


os.register_at_fork(after_in_child=_forget_in_child)


# -- the template's side --------------------------------------------------------------

_inherited: list[int] = []  # in a worker: the descriptors its start request carried


def _serve(requests: socket.socket, loaders_end: socket.socket, loader: int, comm: str) -> None:
    """The template's life: fork a worker per request until the loader's process ends.

    Then its workers end too (each watches the loader's process, and stops
    within a second): the template reaps them, and kills those still there
    after :data:`_ORPHANS_WITHIN` seconds, so none is left to anyone else.
    """
    loaders_end.close()  # our copy of it: the loader's closing must reach us
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    _set_comm(_NAME)
    try:
        loader_fd = os.pidfd_open(loader)
    except (AttributeError, OSError):
        loader_fd = -1  # no pidfd: look at the pid at each wake-up
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> answer socket, pidfd
    poller = select.poll()
    poller.register(requests, select.POLLIN)
    if loader_fd >= 0:
        poller.register(loader_fd, select.POLLIN)
    taking = True
    loader_gone = False
    while (taking or children) and not loader_gone:
        events = poller.poll(None if loader_fd >= 0 else 500)
        loader_gone = loader_fd < 0 and not _running(loader)
        for fd, _ in events:
            if fd == loader_fd:
                loader_gone = True
            elif taking and fd == requests.fileno():
                try:
                    data, fds, _, _ = socket.recv_fds(requests, 16, _MAX_FDS)
                except OSError:
                    data, fds = b"", []
                if not data:  # the loader closed its end: serve the last workers out
                    taking = False
                    poller.unregister(requests)
                    for stray in fds:
                        os.close(stray)
                    continue
                _fork_worker(fds, requests, loader_fd, children, poller, comm)
        _reap(children, poller)
    deadline = time.monotonic() + _ORPHANS_WITHIN
    while children and time.monotonic() < deadline:
        poller.poll(50)
        _reap(children, poller)
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _fork_worker(
    fds: list[int],
    requests: socket.socket,
    loader_fd: int,
    children: dict[int, tuple[socket.socket, int]],
    poller: select.poll,
    comm: str,
) -> None:
    if len(fds) < 2:
        for fd in fds:
            os.close(fd)
        return
    answer = socket.socket(fileno=fds[0])
    start, inherited = fds[1], fds[2:]
    pid = os.fork()
    if pid == 0:
        # The template's own descriptors are not the worker's (closed through their
        # objects, so that nothing closes a reused number later).
        for sock in [requests, answer, *(entry[0] for entry in children.values())]:
            sock.close()
        for _, pidfd in children.values():
            if pidfd >= 0:
                os.close(pidfd)
        _run_worker(start, inherited, loader_fd, comm)
    for fd in fds[1:]:
        os.close(fd)
    _write_signed(answer, pid)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = -1
    if pidfd >= 0:
        poller.register(pidfd, select.POLLIN)
    children[pid] = (answer, pidfd)


def _reap(children: dict[int, tuple[socket.socket, int]], poller: select.poll) -> None:
    """Tells the loader the exit status of every child that has ended, and forgets it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        entry = children.pop(pid, None)
        if entry is None:
            continue
        answer, pidfd = entry
        _write_signed(answer, os.waitstatus_to_exitcode(status))
        answer.close()
        if pidfd >= 0:
            poller.unregister(pidfd)
            os.close(pidfd)


def _run_worker(start: int, inherited: list[int], loader_fd: int, comm: str) -> NoReturn:
    """In the template's child: become the worker ``start`` describes, then exit."""
    global _inherited
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _set_comm(comm)
        _inherited = inherited
        with os.fdopen(start, "rb") as file:
            here = pickle.load(file)
            with contextlib.suppress(OSError):
                os.chdir(here["cwd"])
            os.environ.clear()
            os.environ.update(here["environ"])
            sys.path[:] = here["sys_path"]
            process = pickle.load(file)
        sentinel = os.dup(loader_fd) if loader_fd >= 0 else None
        code = process._bootstrap(parent_sentinel=sentinel)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
