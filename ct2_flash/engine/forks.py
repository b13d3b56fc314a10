"""What a forked child does with the objects it inherits from its parent.

A child of ``fork()`` (a pre-forking server such as gunicorn with ``--preload``, celery's
prefork pool, multiprocessing's fork start) has its parent's memory but only the thread that
forked. A CTranslate2 model runs on threads made with it: in the child a call waits on threads
that are not there, and destroying the model joins them, which hangs (faster-whisper's own
model hangs both ways). The stock worker's pipes and shared memory are the parent's too. So
each object that holds such things registers here, and in every child its ``forget_parent()``
lets go of them: it keeps what cannot be destroyed there (``keep_forever``) and makes its own
at first use. Not in ct2-flash's hands: once ONNX Runtime (1.32) is imported, its own threads
make a forked child that exits normally hang at exit (docs/usage.md, "Stock engine").
"""

from __future__ import annotations

import ctypes
import os
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


def _in_child() -> None:
    for instance in list(_REGISTERED):
        instance.forget_parent()


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_in_child)
