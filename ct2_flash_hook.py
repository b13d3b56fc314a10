"""``CT2_FLASH=1``: ct2-flash in Python programs started by others (a service, a client's
own launcher), without editing them and without ``sitecustomize``.

``ct2-flash hook install`` writes ``ct2_flash_hook.pth`` into this environment's site-packages.
Python runs a ``.pth`` file's ``import`` lines at every start of this environment's
interpreter; this one only reads ``CT2_FLASH`` and, when it is set (not ``0``), imports this
module and calls ``activate()``. Nothing else happens at start-up: ``activate()`` puts a finder
on ``sys.meta_path`` that waits for the program to import ``faster_whisper``, and only then
imports ct2-flash and calls ``ct2_flash.install()`` (so a program that never uses faster-whisper
pays nothing, and one that does pays ct2-flash's import once); ``ctranslate2`` is imported just
before faster_whisper, as ct2-flash imports it, without PyTorch. ``ct2-flash hook remove``
deletes the file. The hook is opt-in twice (the file, then the variable) because a ``.pth``
line runs in every program of the environment, pip included.

What it does then is ``ct2_flash.dropin.hook`` (the options it reads from the environment).

This is a top-level module, not part of the ``ct2_flash`` package, because importing the
package loads the runtime, which a ``.pth`` line must not do.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from typing import Optional

VARIABLE = "CT2_FLASH"
PTH_FILE = "ct2_flash_hook.pth"
# One line: a .pth runs lines that start with "import"; the rest of the line is Python.
PTH_LINE = (
    f"import os; os.environ.get({VARIABLE!r}, '0') not in ('', '0') and __import__('ct2_flash_hook').activate()\n"
)
WATCHED = ("faster_whisper", "ct2_flash")


def activate() -> None:
    """Install ct2-flash once faster-whisper is imported (at once if it already is)."""
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return
    if "faster_whisper" in sys.modules and "ct2_flash" not in sys.modules:
        _install()
        return
    sys.meta_path.insert(0, _Finder())


def _install() -> None:
    from ct2_flash.dropin.hook import install_from_environment

    install_from_environment()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loaders of ``faster_whisper`` and ``ct2_flash`` so that
    ``install()`` runs once the first of them has finished importing and the second is not
    half-imported (ct2_flash imports faster_whisper while it loads)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED:
            return None
        if fullname == "faster_whisper" and "ctranslate2" not in sys.modules:
            # faster_whisper imports ctranslate2 first thing: import it before, as ct2_flash does,
            # without PyTorch (ct2_flash/engine/runtime_import.py).
            _runtime_import().import_runtime()
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None

    def imported(self, name: str) -> None:
        """After watched module ``name`` finished loading: install when faster_whisper is loaded
        and ct2_flash is not half-way through its own import."""
        if "faster_whisper" not in sys.modules or self not in sys.meta_path:
            return
        loading = sys.modules.get("ct2_flash")
        if name != "ct2_flash" and loading is not None and getattr(loading.__spec__, "_initializing", False):
            return  # ct2_flash imports faster_whisper while it loads; its own loader calls back
        sys.meta_path.remove(self)
        _install()


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, finder: _Finder) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.finder.imported(module.__name__)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def _runtime_import():
    """``ct2_flash/engine/runtime_import.py``, loaded from its file: importing it by name would
    import the ``ct2_flash`` package, which imports faster_whisper, the module being imported."""
    package = importlib.util.find_spec("ct2_flash")
    path = os.path.join(package.submodule_search_locations[0], "engine", "runtime_import.py")
    spec = importlib.util.spec_from_file_location("_ct2_flash_runtime_import", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pth_path(site_packages: Optional[str] = None) -> str:
    """Where ``ct2-flash hook install`` writes the ``.pth`` file (this environment's purelib)."""
    return os.path.join(site_packages or sysconfig.get_paths()["purelib"], PTH_FILE)
