"""Driving real faster-whisper clients as their users do, for ``tests/test_clients.py`` and
``bench/clients.py``: the same client started plainly on stock ctranslate2 (what its users
have), plainly on this environment's patched runtime, or under ``ct2-flash run``; a server
waited for on loopback and stopped with SIGTERM; one request per file in each client's own
protocol (Wyoming events, an OpenAI-compatible multipart POST).

The clients are pinned in ``packaging/clients.txt`` (``bash scripts/install.sh --clients``);
their own libraries (``wyoming``) are imported only where a request is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
from faster_whisper import decode_audio

from ct2_flash.benchmark.stock import stock_environment
from ct2_flash.stock.location import environment_with

BIN = os.path.dirname(sys.executable)
CT2_FLASH = os.path.join(BIN, "ct2-flash")
# plain: stock ctranslate2 first on the path; tuned: the same with the allocator a user sets
# without code (stock/allocator.py: tcmalloc preloaded where installed); same: this
# environment's patched runtime; flash: under ``ct2-flash run``.
SYSTEMS = ("plain", "tuned", "same", "flash")
SERVER_START_SECONDS = 120
WYOMING_CHUNK_BYTES = 3200  # 0.1 s of 16 kHz 16-bit mono, as a microphone satellite sends


def command(system: str, program: List[str], stats: str = "") -> Tuple[List[str], Dict[str, str]]:
    """(argv, environment) that run ``program`` (a console script path and its arguments) as
    ``system``: ``plain`` on stock ctranslate2, ``tuned`` the same with the tuned allocator,
    ``same`` on the patched runtime, ``flash`` under ``ct2-flash run`` (with ``--stats stats``
    when given)."""
    if system not in SYSTEMS:
        raise ValueError(f"system must be one of {SYSTEMS}, got {system!r}")
    environment = stock_environment(tuned=system == "tuned") if system in ("plain", "tuned") else environment_with("")
    if system == "flash":
        return [CT2_FLASH, "run", *(["--stats", stats] if stats else []), "--", *program], environment
    return list(program), environment


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def server(argv: List[str], environment: Dict[str, str], port: int, log: str) -> Iterator[subprocess.Popen]:
    """A client's server started on loopback (its output in ``log``), yielded once its port
    accepts connections, stopped with SIGTERM as a service manager stops it."""
    with open(log, "w") as output:
        process = subprocess.Popen(argv, env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {process.returncode}: {open(log).read()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not listen on port {port}: {open(log).read()[-3000:]}")
            time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wyoming_transcript(port: int, path: str, language: str = "en", timeout: float = 300) -> str:
    """One Wyoming exchange (transcribe, audio-start, 0.1 s chunks of 16 kHz 16-bit mono,
    audio-stop) with the server on ``port``; the transcript's text."""
    # Wyoming's library comes with the client (packaging/clients.txt), not with ct2-flash.
    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    samples = (np.clip(decode_audio(path), -1, 1) * 32767).astype("<i2").tobytes()

    async def exchange() -> str:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Transcribe(language=language).event())
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            for start in range(0, len(samples), WYOMING_CHUNK_BYTES):
                chunk = samples[start : start + WYOMING_CHUNK_BYTES]
                await client.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=chunk).event())
            await client.write_event(AudioStop().event())
            while True:
                event = await asyncio.wait_for(client.read_event(), timeout=timeout)
                if event is None:
                    raise ConnectionError("the Wyoming server closed the connection before its transcript")
                if Transcript.is_type(event.type):
                    return Transcript.from_event(event).text

    return asyncio.run(exchange())


def post_transcription(port: int, path: str, timeout: float = 300, fields: Optional[Dict[str, str]] = None) -> dict:
    """``POST /v1/audio/transcriptions`` (multipart form, ``verbose_json`` and ``fields``, for
    example ``{"temperature": "0"}``) of ``path`` to the OpenAI-compatible server on ``port``;
    its JSON answer."""
    boundary = uuid.uuid4().hex
    form = {"response_format": "verbose_json", **(fields or {})}
    body = b"".join(
        [
            *(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
                for name, value in form.items()
            ),
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{os.path.basename(path)}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n".encode(),
            open(path, "rb").read(),
            f"\r\n--{boundary}--\r\n".encode(),
        ]
    )
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/audio/transcriptions",
        data=body,
        method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wyoming_program(
    port: int, model: str, data_dir: str, compute_type: str, threads: int, language: str = "en"
) -> List[str]:
    """The command line of a wyoming-faster-whisper server on ``port`` serving ``model``
    greedily (``--beam-size 1``) with faster-whisper."""
    return [
        os.path.join(BIN, "wyoming-faster-whisper"),
        "--uri",
        f"tcp://127.0.0.1:{port}",
        "--model",
        model,
        "--data-dir",
        data_dir,
        "--stt-library",
        "faster-whisper",
        "--compute-type",
        compute_type,
        "--beam-size",
        "1",
        "--cpu-threads",
        str(threads),
        "--language",
        language,
    ]


def server_config(path: str, model: str, compute_type: str, threads: int, language: str = "en") -> str:
    """A faster-whisper-server ``--config`` file (YAML reads JSON) serving ``model`` greedily
    as ``whisper-1``; returns ``path``."""
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(
            {
                "models": [
                    {
                        "name": "whisper-1",
                        "path": model,
                        "model_options": {"device": "cpu", "compute_type": compute_type, "cpu_threads": threads},
                        "transcribe_options": {"beam_size": 1, "language": language},
                    }
                ]
            },
            stream,
        )
    return path
