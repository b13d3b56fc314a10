"""What a forked child does with the objects it inherits from its parent.

A child of ``fork()`` (a pre-forking server such as gunicorn with ``--preload``, celery's
prefork pool, multiprocessing's fork start) has its parent's memory but only the thread that
forked. A CTranslate2 model runs on threads made with it: in the child a call waits on threads
that are not there, and destroying the model joins them, which hangs (faster-whisper's own
model hangs both ways). The stock worker's pipes and shared memory are the parent's too. So
each object that holds such things registers here, and in every child its ``forget_parent()``
lets go of them: it keeps what cannot be destroyed there (``keep_forever``) and makes its own
at first use.

ONNX Runtime (1.32) cannot be forgotten that way: once it is imported, by the drafter's first
round or faster-whisper's VAD, a forked child that exits normally hangs in its C++
destructors, which wait on a condition variable of a thread that did not come along. So in
such a child the C exit handlers it inherited are skipped (``_skip_inherited_exit_handlers``):
Python's own finalisation (atexit handlers, buffered output) runs as ever, and then the
process ends with its exit status.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import weakref

# Objects whose forget_parent() runs in every forked child of this process.
_REGISTERED: "weakref.WeakSet" = weakref.WeakSet()


def forget_parent_in_children(instance) -> None:
    """Call ``instance.forget_parent()`` in each child this process forks, while it lives."""
    _REGISTERED.add(instance)


def keep_forever(*objects) -> None:
    """Never destroy ``objects`` in this process: one more reference is counted for each, and
    none will take it back. For a child's copies of its parent's engine objects, whose
    destructors would join threads that did not come along."""
    for value in objects:
        if value is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(value))


def _skip_inherited_exit_handlers() -> bool:
    """In a forked child: end the process as soon as the C exit handlers registered from now on
    have run, before those inherited from the parent (C++ destructors of its libraries). glibc's
    ``on_exit`` passes the exit status to ``_exit``, which takes it and ignores the second
    argument. Returns whether it could (not without ``on_exit``: musl, macOS)."""
    libc = ctypes.CDLL(None)
    on_exit = getattr(libc, "on_exit", None)
    if on_exit is None:
        return False
    on_exit.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    on_exit.restype = ctypes.c_int
    if on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None) != 0:
        return False
    # exit() flushes C stdio buffers after its handlers; _exit does not. Python's atexit
    # handlers run before any C one, and this one after those the child registers from now on.
    libc.fflush.argtypes = (ctypes.c_void_p,)
    atexit.register(libc.fflush, None)
    return True


def _in_child() -> None:
    for instance in list(_REGISTERED):
        instance.forget_parent()
    if "onnxruntime.capi.onnxruntime_pybind11_state" in sys.modules:
        _skip_inherited_exit_handlers()


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_in_child)
