"""The Whisper-Flash draft round in ONNX Runtime: the drafter users run, without PyTorch.

``ct2-flash convert-drafter`` (``ct2_flash/converters/drafter.py``) exports a trained drafter as three
graphs (see ``ct2_flash/converters/graphs.py``): the window's audio keys/values, the history keys/values
of the target states a round kept, and the block proposal. ``OnnxDrafter`` runs them on one
intra-op thread (a round is too small to split, and CTranslate2 owns the other threads), with
every cache allocated once per window:

- the audio keys/values are bound to the proposal graph once per window (I/O binding), not
  passed again every round;
- the history keys/values live in preallocated ``[rows, heads, head_dim]`` buffers; a round
  writes the rows the target kept and binds the first T rows, which are contiguous, so a
  rollback is a shorter T and nothing is copied.

It gives the same proposals as the PyTorch drafter on the float32 graphs (tested); the int8
graphs (dynamic quantisation of the weights) are the default on CPU, where a round is bound by
memory traffic. Proposals are only suggestions: precision changes speed and acceptance, never
the output.

ONNX Runtime opens the graphs where the loop is first about to run (``prepare``, which the
model calls before the call's first window; ``begin`` otherwise), not when the drafter is made:
most calls never reach the loop (beam search, int8, the router's choice), and importing ONNX
Runtime and opening three sessions was the larger part of a float32 model's build
(docs/measurements.md, "Start-up"). A damaged graph is still refused at construction:
``export.json`` records each graph's SHA-256, checked there, and what each graph takes and
gives, so the drafter knows its proposal graph without opening it. Drafters converted before
these were recorded open at construction, as ONNX Runtime's load was their check. Where the
graphs pass both checks and ONNX Runtime still cannot open them (an ``export.json`` edited by
hand, a broken ONNX Runtime), ``prepare`` raises, and the model decodes with CTranslate2's own
``generate()`` from then on, with a warning: the same tokens, nothing lost mid-transcription.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.drafting.audio_window import AUDIO_WINDOW, audio_window_span, check_audio_window
from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal
from ct2_flash.drafting.files import (
    CheckpointError,
    DrafterConfig,
    check_target,
    proposal_rows,
    read_config,
    target_identity,
)
from ct2_flash.drafting.round_options import check_round_options, cut_by_confidence
from ct2_flash.engine.model_files import CT2ModelFile

EXPORT_FILE = "export.json"
GRAPHS = ("audio", "history", "propose")
PRECISIONS = ("int8", "float32")
# The ONNX opset the converter writes; ONNX Runtime >= 1.14 runs it.
OPSET = 17


@dataclass(frozen=True)
class ExportManifest:
    """What ``export.json`` records: the graph files per precision and how they were checked.

    Attributes:
        opset: ONNX opset of every graph.
        graphs: precision -> graph name ("audio", "history", "propose") -> file name.
        verification: precision -> agreement with the PyTorch drafter (see the converter).
        vocabulary: the token id of each column of the proposal graph's ``logits`` output (the
            drafter's shortlist), or None for drafters converted before it was written (they
            propose greedily only).
        digests: precision -> graph name -> SHA-256 (hex) of its file, as written; None for
            drafters converted before digests were recorded. ``write`` computes them.
        interfaces: precision -> graph name -> {"inputs": [name, ...], "outputs": {name:
            shape}} (a shape's entries are sizes or the names of dynamic axes), as ONNX Runtime
            reads the graph; None where not recorded. ``write`` reads them.
    """

    opset: int
    graphs: Dict[str, Dict[str, str]]
    verification: Dict[str, dict]
    vocabulary: Optional[List[int]] = None
    digests: Optional[Dict[str, Dict[str, str]]] = None
    interfaces: Optional[Dict[str, Dict[str, dict]]] = None

    @classmethod
    def read(cls, directory: str) -> "ExportManifest":
        path = os.path.join(directory, EXPORT_FILE)
        if not os.path.isfile(path):
            raise CheckpointError(
                f"drafter {directory!r} has no exported graphs ({EXPORT_FILE}); convert its "
                f"checkpoint with: ct2-flash convert-drafter CHECKPOINT {directory}"
            )
        try:
            with open(path, encoding="utf-8") as stream:
                data = json.load(stream)
            manifest = cls(
                opset=int(data["opset"]),
                graphs=data["graphs"],
                verification=data.get("verification", {}),
                vocabulary=data.get("vocabulary"),
                digests=data.get("digests"),
                interfaces=data.get("interfaces"),
            )
        except (ValueError, TypeError, KeyError) as error:
            raise CheckpointError(f"{path} is not a valid export manifest: {error}") from error
        for precision, files in manifest.graphs.items():
            if set(files) != set(GRAPHS):
                raise CheckpointError(f"{path}: {precision} graphs {sorted(files)}, expected {list(GRAPHS)}")
        return manifest

    def write(self, directory: str) -> None:
        """Write ``export.json`` into ``directory``, with the digests and interfaces of the graph
        files there."""
        paths = {
            precision: {graph: os.path.join(directory, name) for graph, name in files.items()}
            for precision, files in self.graphs.items()
        }
        digests = {
            precision: {graph: file_digest(path) for graph, path in files.items()} for precision, files in paths.items()
        }
        interfaces = {
            precision: {
                graph: graph_interface(_session(path, 1, ["CPUExecutionProvider"])) for graph, path in files.items()
            }
            for precision, files in paths.items()
        }
        with open(os.path.join(directory, EXPORT_FILE), "w", encoding="utf-8") as stream:
            record = {
                "opset": self.opset,
                "graphs": self.graphs,
                "verification": self.verification,
                "digests": digests,
                "interfaces": interfaces,
            }
            if self.vocabulary is not None:
                record["vocabulary"] = self.vocabulary
            json.dump(record, stream, indent=2)


def file_digest(path: str) -> str:
    """SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def has_graphs(directory: str) -> bool:
    """Whether ``directory`` holds a converted drafter (``export.json``)."""
    return os.path.isfile(os.path.join(directory, EXPORT_FILE))


def graph_interface(session) -> dict:
    """{"inputs": [name, ...], "outputs": {name: shape}} of an ONNX Runtime session's graph."""
    return {
        "inputs": [graph_input.name for graph_input in session.get_inputs()],
        "outputs": {output.name: list(output.shape) for output in session.get_outputs()},
    }


def _check_graph(path: str, digest: Optional[str]) -> None:
    """A missing file, or one whose bytes are not those the converter wrote (``digest``, where
    recorded), names itself and the command that rewrites it."""
    rewrite = f"rewrite the drafter with ct2-flash convert-drafter CHECKPOINT {os.path.dirname(path)} --force"
    if not os.path.isfile(path):
        raise CheckpointError(f"drafter graph {path} is missing; {rewrite}")
    if digest is not None and file_digest(path) != digest:
        raise CheckpointError(
            f"drafter graph {path} is damaged (its SHA-256 is not the one {EXPORT_FILE} records); {rewrite}"
        )


def _session(path: str, threads: int, providers: Sequence):
    """An ONNX Runtime session for one graph; a truncated or unloadable file names itself and
    the command that rewrites it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # warnings about unused initializers are not the user's business
    try:
        return ort.InferenceSession(path, options, providers=list(providers))
    except Exception as error:  # onnxruntime raises its own Fail/InvalidGraph/... types
        raise CheckpointError(
            f"ONNX Runtime {ort.__version__} cannot load drafter graph {path} ({error}); the file is "
            f"damaged or needs a newer onnxruntime. Rewrite it with ct2-flash convert-drafter CHECKPOINT "
            f"{os.path.dirname(path)} --force, or upgrade onnxruntime"
        ) from error


def _providers(device: str) -> List:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("device='cuda' needs onnxruntime-gpu (pip install onnxruntime-gpu)")
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


class OnnxDrafter(Drafter):
    """Drafts with the exported graphs of a converted Whisper-Flash drafter.

    Args:
        directory: the converted drafter (``drafter.json``, ``export.json`` and the graphs).
        model_path: the target's CTranslate2 directory: the drafter is checked against it, and
            its token embedding gives the anchor's input row.
        precision: "int8" (default) or "float32" graphs.
        min_confidence: stop the proposal where the drafter's joint probability of the tokens
            so far falls below this (0 proposes all K); see ``cut_by_confidence``.
        threads: ONNX Runtime intra-op threads (1: a round is too small to split).
        device: "cpu", or "cuda" for ONNX Runtime's CUDA execution provider (onnxruntime-gpu).
        audio_window: (frames before, frames after) the position where the target reads (its
            alignment heads' attention peak) that a round's cross-attention reads, or None
            for every frame of the window's audio. Cross-attention over every frame is most
            of a round on a 30 s window, and a window around the reading position proposes as
            well as the whole window (docs/measurements.md, "Figures behind the code's
            constants").

    Raises:
        CheckpointError: missing or unreadable files, with the command that rewrites them.
        DrafterMismatchError: the drafter was trained for another target.
        ImportError: ONNX Runtime is not installed.
    """

    needs_states = True

    def __init__(
        self,
        directory: str,
        model_path: str,
        precision: str = "int8",
        min_confidence: float = 0.1,
        threads: int = 1,
        device: str = "cpu",
        audio_window: Optional[Tuple[int, int]] = AUDIO_WINDOW,
    ) -> None:
        check_round_options(precision, PRECISIONS, min_confidence, threads)
        if importlib.util.find_spec("onnxruntime") is None:  # imported only when the graphs open
            raise ImportError(
                "a converted drafter runs in ONNX Runtime, which is not installed: pip install onnxruntime"
            )
        self.audio_window = check_audio_window(audio_window)
        self.wants_position = audio_window is not None
        config: DrafterConfig = read_config(directory)
        check_target(config, target_identity(model_path, os.path.basename(os.path.normpath(model_path))))
        manifest = ExportManifest.read(directory)
        if precision not in manifest.graphs:
            raise CheckpointError(f"drafter {directory!r} has no {precision} graphs (it has {sorted(manifest.graphs)})")
        self._providers = _providers(device)
        self._threads = threads
        self._paths = {graph: os.path.join(directory, name) for graph, name in manifest.graphs[precision].items()}
        digests = (manifest.digests or {}).get(precision, {})
        for graph, path in self._paths.items():
            _check_graph(path, digests.get(graph))
        self.config = config
        self.precision = precision
        self.min_confidence = min_confidence
        self.vocab_size = config.target.vocab_size
        self.num_draft_tokens = config.num_draft_tokens
        layers = config.num_layers
        self._history_names = [f"history_{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]
        self._audio_names = [f"audio_{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]
        # The anchor's input row; float16 as stored, cast per round (one row).
        self._embedding = np.asarray(CT2ModelFile(model_path)["decoder/embeddings/weight"])
        head_dim = config.d_model // config.num_heads
        # Room for every position the target can hold, plus one block.
        rows = config.max_positions + config.num_draft_tokens + 1
        self._buffers = [np.zeros((rows, config.num_heads, head_dim), dtype=np.float32) for _ in self._history_names]
        self._sessions_open = False
        interfaces = (manifest.interfaces or {}).get(precision, {})
        if digests and "propose" in interfaces and manifest.opset <= OPSET:
            propose = interfaces["propose"]
        else:
            # Converted before digests and interfaces were recorded, or by a newer converter:
            # ONNX Runtime's load is the check, so it comes now.
            self.prepare()
            propose = graph_interface(self._propose)
        # Graphs converted before proposals had a length take the anchor's position alone and
        # always compute K rows; current ones compute as many rows as ``positions`` has.
        self._rows_input = "positions" in propose["inputs"]
        self.proposes_prefixes = config.causal_blocks and self._rows_input
        self._bind_logits = False  # whether the window binds the logits output (sampling)
        self._output_rows: Optional[int] = None  # rows of the proposal the outputs were bound for
        # The proposal distribution, for sampled decoding, where the graph has it.
        self._vocabulary = _proposal_vocabulary(manifest, propose, self.vocab_size, directory)
        self._audio_kv: List[np.ndarray] = []  # per layer keys, values [heads, frames, head_dim]
        self._audio_span = (0, 0)  # the frames the binding reads
        self._bound_audio: List[np.ndarray] = []
        self._rows = 0  # history rows in use
        self._history_start = 0  # text position of history row 0
        self._cache_length = 0  # the target's cache length = the next anchor's position

    def prepare(self) -> None:
        """Open the graphs in ONNX Runtime, once (the module docstring says when)."""
        if self._sessions_open:
            return
        self._audio = _session(self._paths["audio"], self._threads, self._providers)
        self._history = _session(self._paths["history"], self._threads, self._providers)
        self._propose = _session(self._paths["propose"], self._threads, self._providers)
        self._binding = self._propose.io_binding()
        self._sessions_open = True

    def begin(self, window: DraftWindow) -> None:
        self.prepare()
        encoder_output = np.ascontiguousarray(window.drafter_audio(), dtype=np.float32)[None]
        # Held here: the binding points at these arrays for the whole window.
        self._audio_kv = self._audio.run(self._audio_names, {"encoder_output": encoder_output})
        self._audio_span = (-1, -1)  # new arrays: bind whatever the span
        self._bind_audio(0, encoder_output.shape[1])
        # Only sampling draws from the drafter's distribution; greedy rounds need not pay for
        # copying its [K, shortlist] logits out.
        self._bind_logits = self._vocabulary is not None and window.options.sampling
        self._bind_outputs(None)
        self._rows = 0
        # The first states the controller hands over are those of the last prompt position.
        self._history_start = len(window.prompt) - 1
        self._cache_length = len(window.prompt)

    def _bind_outputs(self, rows: Optional[int]) -> None:
        """Let ONNX Runtime allocate the outputs of a ``rows``-row proposal: it keeps the arrays
        of a run for the next, which fails once the number of rows changes."""
        self._binding.clear_binding_outputs()
        for name in ("tokens", "log_probs", "logits") if self._bind_logits else ("tokens", "log_probs"):
            self._binding.bind_output(name)
        self._output_rows = rows

    def observe_position(self, frame: int) -> None:
        self._bind_audio(*audio_window_span(frame, self._audio_kv[0].shape[1], self.audio_window))

    def _bind_audio(self, start: int, stop: int) -> None:
        """Bind frames [start, stop) of the audio keys/values (the whole arrays without a copy)."""
        if (start, stop) == self._audio_span:
            return
        whole = start == 0 and stop == self._audio_kv[0].shape[1]
        # Held here: the binding points at these arrays until the next bind.
        self._bound_audio = [array if whole else np.ascontiguousarray(array[:, start:stop]) for array in self._audio_kv]
        for name, array in zip(self._audio_names, self._bound_audio):
            self._binding.bind_cpu_input(name, array)
        self._audio_span = (start, stop)

    def advance(self, states: Optional[np.ndarray], cache_length: int) -> None:
        if states is None:
            return
        count = len(states)
        keep = cache_length - count - self._history_start  # rows before the new ones
        positions = np.arange(cache_length - count, cache_length, dtype=np.int64)
        new = self._history.run(
            self._history_names, {"states": np.ascontiguousarray(states, dtype=np.float32), "positions": positions}
        )
        if keep + count > len(self._buffers[0]):
            self._buffers = [np.concatenate([b, np.zeros_like(b)]) for b in self._buffers]
        for buffer, rows in zip(self._buffers, new):
            buffer[keep : keep + count] = rows
        self._rows = keep + count
        self._cache_length = cache_length

    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        binding = self._binding
        binding.bind_cpu_input("anchor_embedding", self._embedding[int(generated[-1])][None].astype(np.float32))
        if self._rows_input:
            rows = proposal_rows(self.config, num_tokens)
            if rows != self._output_rows:
                self._bind_outputs(rows)
            binding.bind_cpu_input(
                "positions", np.arange(self._cache_length, self._cache_length + rows + 1, dtype=np.int64)
            )
        else:
            binding.bind_cpu_input("position", np.array([self._cache_length], dtype=np.int64))
        for name, buffer in zip(self._history_names, self._buffers):
            binding.bind_cpu_input(name, buffer[: self._rows])  # a contiguous prefix: no copy
        self._propose.run_with_iobinding(binding)
        tokens, log_probs, *logits = binding.copy_outputs_to_cpu()
        proposal = Proposal(
            tokens=tuple(tokens[:num_tokens].tolist()),
            log_probs=tuple(log_probs[:num_tokens].tolist()),
            logits=logits[0][:num_tokens] if logits else None,
            vocabulary=self._vocabulary,
        )
        return cut_by_confidence(proposal, self.min_confidence)


def _proposal_vocabulary(manifest: ExportManifest, propose: dict, vocab_size: int, directory: str):
    """The token ids of the proposal graph's logit columns (its shortlist), for sampled
    decoding, or None where the graph has no logits or the manifest no vocabulary.

    Raises:
        CheckpointError: the ids do not fit the graph's logits or a ``vocab_size``-token model.
    """
    if manifest.vocabulary is None or "logits" not in propose["outputs"]:
        return None
    vocabulary = np.asarray(manifest.vocabulary, dtype=np.int64)
    width = propose["outputs"]["logits"][-1]
    if (
        vocabulary.ndim != 1
        or (isinstance(width, int) and width != len(vocabulary))
        or len(vocabulary)
        and not 0 <= vocabulary.min() <= vocabulary.max() < vocab_size
    ):
        raise CheckpointError(
            f"{os.path.join(directory, EXPORT_FILE)}: its vocabulary does not match the "
            f"proposal graph's {width} logits of a {vocab_size}-token model; rewrite "
            f"it with ct2-flash convert-drafter CHECKPOINT {directory} --force"
        )
    return vocabulary
