"""What the benchmark transcribes: a TSV manifest (audio path, reference text) or a directory."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import List

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".m4a", ".webm")


@dataclass(frozen=True)
class Utterance:
    """One input: an audio file and its reference transcript ("" when there is none)."""

    path: str
    reference: str = ""

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def read_manifest(path: str) -> List[Utterance]:
    """Read ``audio<TAB>reference`` lines (relative paths are relative to the manifest).

    A header line ``path<TAB>text`` is allowed, and columns after the reference (a duration,
    a speaker) are ignored. Raises ValueError naming the line for a missing audio file, and
    for an empty manifest.
    """
    base = os.path.dirname(os.path.abspath(path))
    utterances = []
    with open(path, encoding="utf-8", newline="") as stream:
        for number, row in enumerate(csv.reader(stream, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not row or not row[0].strip() or (number == 1 and row[0] in ("path", "audio")):
                continue
            audio = os.path.normpath(row[0] if os.path.isabs(row[0]) else os.path.join(base, row[0]))
            if not os.path.isfile(audio):
                raise ValueError(f"{path}:{number}: audio file {audio!r} does not exist")
            utterances.append(Utterance(audio, row[1].strip() if len(row) > 1 else ""))
    if not utterances:
        raise ValueError(f"{path} lists no audio")
    return utterances


def from_directory(directory: str) -> List[Utterance]:
    """Every audio file in ``directory`` (sorted, not recursive), without references.

    A ``<name>.txt`` or ``<name>.lab`` next to an audio file is used as its reference.
    """
    utterances = []
    for name in sorted(os.listdir(directory)):
        stem, extension = os.path.splitext(name)
        if extension.lower() not in AUDIO_EXTENSIONS:
            continue
        reference = ""
        for suffix in (".txt", ".lab"):
            candidate = os.path.join(directory, stem + suffix)
            if os.path.isfile(candidate):
                with open(candidate, encoding="utf-8") as stream:
                    reference = " ".join(stream.read().split())
                break
        utterances.append(Utterance(os.path.join(directory, name), reference))
    if not utterances:
        raise ValueError(f"{directory} contains no audio files ({', '.join(AUDIO_EXTENSIONS)})")
    return utterances


def write_manifest(path: str, utterances: List[Utterance]) -> None:
    """Write a manifest that ``read_manifest`` reads back (paths relative when possible)."""
    base = os.path.dirname(os.path.abspath(path))
    os.makedirs(base, exist_ok=True)
    with open(path, "w", encoding="utf-8") as stream:
        stream.write("path\ttext\n")
        for utterance in utterances:
            reference = " ".join(utterance.reference.split())  # no tabs or newlines inside
            stream.write(f"{os.path.relpath(utterance.path, base)}\t{reference}\n")
