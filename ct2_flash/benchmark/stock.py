"""The baseline users run today: faster-whisper on stock ``ctranslate2``, in another process.

Stock and patched runtimes install the same ``ctranslate2`` module, so they cannot share a
process. ``StockWorker`` drives ``stock_worker.py`` over stdin/stdout so its runs interleave
with the in-process systems on the same decoded audio, either in this environment with the
stock engine's directory (``ct2_flash.stock.location``, installed by scripts/install.sh) first
on its path (``local_baseline``: this environment's faster-whisper is the pinned release), or
in a separate virtual environment with pinned stock packages (``ensure_environment``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import venv
from typing import Dict, List, Tuple

import numpy as np

from ct2_flash.benchmark.measure import Measurement
from ct2_flash.stock.allocator import GLIBC_DEFAULT, Allocator, loaded_allocator, tuned_allocator
from ct2_flash.stock.location import STOCK_CTRANSLATE2, environment_with, installed, stock_dir

logger = logging.getLogger("ct2_flash")

# faster-whisper on stock ctranslate2, each in a process of its own: as installed, and with
# the allocator a user sets without code (tcmalloc preloaded, else glibc's variables).
STOCK_SYSTEMS = ("stock", "tuned_stock")
# What `pip install faster-whisper` gives today, pinned so the baseline does not drift.
STOCK_REQUIREMENTS = ("faster-whisper==1.2.1", "ctranslate2==4.8.5")


def default_environment() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "stock-venv")


def ensure_environment(path: str = "") -> str:
    """Create the stock environment if needed; returns its python. Reused when it already has
    the pinned versions."""
    path = path or default_environment()
    python = os.path.join(path, "bin", "python")
    marker = os.path.join(path, "ct2_flash_stock.json")
    if os.path.isfile(marker):
        with open(marker, encoding="utf-8") as stream:
            if json.load(stream).get("requirements") == list(STOCK_REQUIREMENTS):
                return python
    if not os.path.isfile(python):
        venv.EnvBuilder(with_pip=True).create(path)
    result = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", *STOCK_REQUIREMENTS], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"could not install the stock baseline into {path}:\n{result.stderr.strip()}")
    check = subprocess.run(
        [python, "-c", "import ctranslate2; assert not hasattr(ctranslate2.models.Whisper, 'forward_batch')"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        raise RuntimeError(f"{path} does not hold a stock ctranslate2:\n{check.stderr.strip()}")
    with open(marker, "w", encoding="utf-8") as stream:
        json.dump({"requirements": list(STOCK_REQUIREMENTS)}, stream)
    return python


def local_baseline() -> Tuple[str, str]:
    """(python, path) for ``StockWorker``: this interpreter, the stock engine's directory first.

    Raises:
        RuntimeError: the stock engine is not installed (how to install it is said).
    """
    if not installed():
        raise RuntimeError(
            f"stock ctranslate2 is not installed in {stock_dir()} (python -m ct2_flash.stock "
            "installs it; or give a separate environment with --stock-env)"
        )
    return sys.executable, stock_dir()


class StockWorker:
    """A stock faster-whisper model living in another process.

    Args:
        python: the stock environment's interpreter.
        model_path, compute_type, threads: as for ``WhisperModel``.
        path: a directory put first on the worker's ``sys.path`` (``local_baseline``), or "".
        num_workers: as for ``WhisperModel``: threads that may share the model (``shared``).
        allocator: the allocator setting the worker runs under (``allocator.tuned_allocator()``
            for stock as an informed user tunes it); the default is glibc as it comes.

    Attributes:
        allocator: what was asked for, ``allocator.describe()``.
        allocator_loaded: what the worker runs, read from its memory maps ("tcmalloc", "glibc").
    """

    def __init__(
        self,
        python: str,
        model_path: str,
        compute_type: str,
        threads: int,
        path: str = "",
        num_workers: int = 1,
        allocator: Allocator = GLIBC_DEFAULT,
    ) -> None:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stock_worker.py")
        self._process = subprocess.Popen(
            [python, script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=allocator.environment(environment_with(path)),
        )
        self.allocator = allocator.describe()
        self._scratch = tempfile.TemporaryDirectory(prefix="ct2_flash_stock_")
        self._files: dict = {}
        self.version = self._ask(
            {"model": model_path, "compute_type": compute_type, "threads": threads, "num_workers": num_workers}
        )["ctranslate2"]
        self.allocator_loaded = loaded_allocator(self._process.pid)
        if path and self.version != STOCK_CTRANSLATE2:
            self.close()
            raise RuntimeError(
                f"the worker found ctranslate2 {self.version}, not the stock {STOCK_CTRANSLATE2} in {path}"
            )

    def _ask(self, request: dict) -> dict:
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the stock worker exited (code {self._process.poll()})")
        return json.loads(line)

    def measure(self, key: str, audio: np.ndarray, seed: int, batched: bool = False, **options) -> Measurement:
        """Transcribe ``audio`` there (sent once per ``key`` as a .npy file) and time it there;
        ``batched``: through faster-whisper's ``BatchedInferencePipeline`` (``batch_size`` in ``options``)."""
        answer = self._ask({"audio": self._file(key, audio), "options": options, "seed": seed, "batched": batched})
        return Measurement(
            text=answer["text"],
            tokens=answer["tokens"],
            segments=[],
            whole_seconds=answer["whole"],
            encode_seconds=answer["encode"],
            decode_seconds=answer["decode"],
            temperatures=answer.get("temperatures", []),
            words=[tuple(word) for word in answer.get("words", [])],
        )

    def shared(self, clips: Dict[str, np.ndarray], workers: int, **options) -> Tuple[float, List[list]]:
        """``workers`` threads sharing the model there transcribe ``clips`` (key -> audio, split
        among them in turns): (wall seconds timed there, per clip in order its segments' tokens).
        ``num_workers`` should be ``workers``."""
        answer = self._ask(
            {"audios": [self._file(key, audio) for key, audio in clips.items()], "workers": workers, "options": options}
        )
        return answer["seconds"], answer["tokens"]

    def _file(self, key: str, audio: np.ndarray) -> str:
        """The .npy file holding ``audio`` there, written at its key's first use."""
        if key not in self._files:
            self._files[key] = os.path.join(self._scratch.name, f"{len(self._files)}.npy")
            np.save(self._files[key], audio)
        return self._files[key]

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=30)
        self._scratch.cleanup()

    def __enter__(self) -> "StockWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stock_environment(tuned: bool = False) -> Dict[str, str]:
    """This process's environment with stock ctranslate2 first on the path (what a stock
    system's child runs on); with ``tuned``, also the tuned allocator's variables
    (``stock.allocator.tuned_allocator``: tcmalloc preloaded where installed)."""
    environment = environment_with(stock_dir())
    return tuned_allocator().environment(environment) if tuned else environment


def stock_systems(
    python: str, model_path: str, compute_type: str, threads: int, path: str = ""
) -> Dict[str, StockWorker]:
    """``STOCK_SYSTEMS`` name -> its ``StockWorker`` (arguments as the worker's); every one
    started is closed if another fails to start. A tuned system whose preload the loader
    refused runs glibc: a warning says so, and its ``allocator_loaded`` records it."""
    workers: Dict[str, StockWorker] = {}
    try:
        for name, allocator in zip(STOCK_SYSTEMS, (GLIBC_DEFAULT, tuned_allocator())):
            workers[name] = StockWorker(python, model_path, compute_type, threads, path, allocator=allocator)
    except BaseException:
        for worker in workers.values():
            worker.close()
        raise
    tuned = workers["tuned_stock"]
    if tuned.allocator.startswith("tcmalloc") and tuned.allocator_loaded != "tcmalloc":
        logger.warning(
            "ct2-flash: the tuned stock system asked for %s, but its process runs %s (the loader refused the preload)",
            tuned.allocator,
            tuned.allocator_loaded,
        )
    return workers


def allocators_of(workers: Dict[str, StockWorker]) -> Dict[str, dict]:
    """For a report: per stock system, the allocator asked for and the one its process runs."""
    return {name: {"asked": worker.allocator, "loaded": worker.allocator_loaded} for name, worker in workers.items()}
