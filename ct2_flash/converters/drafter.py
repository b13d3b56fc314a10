"""``ct2-flash convert-drafter CHECKPOINT OUT``: a training checkpoint -> a deployable drafter.

The output directory holds:

- ``drafter.json`` and ``drafter.safetensors``: the config (with the target it belongs to) and
  float16 weights, the source every other file is made from;
- ``audio.onnx``, ``history.onnx``, ``propose.onnx``: the draft round's three graphs
  (``graphs.py``), float32 arithmetic, large weights stored as float16 and cast when ONNX
  Runtime loads the graph (constant folding), which halves the files;
- ``*.int8.onnx``: the same graphs with int8 weights (ONNX Runtime dynamic quantisation), the
  default on CPU;
- ``export.json``: the opset, the files, and how each precision agreed with the PyTorch
  drafter on validation windows: top-1 agreement per draft position and the largest difference
  in the proposed token's log-probability.

Every graph is exported from the float16-rounded weights, so the float32 graphs compute what
the PyTorch drafter loaded from ``drafter.safetensors`` computes. A float32 graph that
disagrees with PyTorch beyond ``FLOAT32_TOLERANCE`` fails the conversion and nothing is
written.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from ct2_flash.drafting.files import CONFIG_FILE, WEIGHTS_FILE, read_config
from ct2_flash.drafting.onnx_drafter import EXPORT_FILE, OPSET, ExportManifest, OnnxDrafter

logger = logging.getLogger("ct2_flash")

# Largest |log-probability difference| allowed between the float32 graphs and PyTorch.
FLOAT32_TOLERANCE = 1e-3
_FILES = {
    "float32": {"audio": "audio.onnx", "history": "history.onnx", "propose": "propose.onnx"},
    "int8": {"audio": "audio.int8.onnx", "history": "history.int8.onnx", "propose": "propose.int8.onnx"},
}
# Initializers at least this large are stored as float16 in the float32 graphs.
_FLOAT16_STORAGE_MIN = 1024


class ConversionError(RuntimeError):
    """The exported graphs do not compute what the PyTorch drafter computes."""


@dataclass(frozen=True)
class ValidationWindow:
    """A window the target decoded, as both drafters see it round by round.

    Attributes:
        encoder_output: [frames, d_model] float32.
        prompt: the prompt the window was decoded with.
        tokens: [T] the target's greedy tokens.
        states: [T, d_model] target states of the last prompt position and the first T - 1
            tokens (the history each anchor sees ends with the state before it).
    """

    encoder_output: np.ndarray
    prompt: tuple
    tokens: List[int]
    states: np.ndarray


def convert_drafter(
    checkpoint: str,
    output_dir: str,
    model_path: Optional[str] = None,
    *,
    force: bool = False,
    audio: Sequence[str] = (),
    max_positions: int = 200,
) -> ExportManifest:
    """Convert ``checkpoint`` into ``output_dir`` (see the module docstring).

    Args:
        checkpoint: a drafter checkpoint directory (``drafter.json`` + ``drafter.safetensors``).
        output_dir: where to write; may be ``checkpoint`` itself with ``force``. Files other than
            the drafter's own (a training report, say) are left alone.
        model_path: the target's CTranslate2 directory (default: the embedded model the
            checkpoint names).
        force: overwrite the drafter files of an existing output.
        audio: audio files for the verification windows (default: the bundled sample).
        max_positions: verify at most this many anchor positions in all.

    Raises:
        FileExistsError: ``output_dir`` already holds a drafter and ``force`` is False.
        ConversionError: the float32 graphs disagree with PyTorch.
    """
    import torch

    from ct2_flash.drafting.flash_drafter import load_checkpoint, save_checkpoint
    from ct2_flash.engine.models import resolve_model

    config = read_config(checkpoint)
    model_path = model_path or resolve_model(config.target.model_name)
    ours = [name for name in (CONFIG_FILE, WEIGHTS_FILE, EXPORT_FILE) if os.path.exists(os.path.join(output_dir, name))]
    if ours and not force:
        raise FileExistsError(f"{output_dir} already holds a drafter ({', '.join(ours)}); use --force to overwrite it")
    windows = validation_windows(model_path, audio or [_bundled_sample()])
    with tempfile.TemporaryDirectory() as work:
        # Round the weights to what is shipped first, so every graph is made from them.
        save_checkpoint(load_checkpoint(checkpoint, model_path), work, torch.float16)
        model = load_checkpoint(work, model_path)
        export_graphs(model, work)
        vocabulary = [int(i) for i in model.shortlist.tolist()]
        ExportManifest(opset=OPSET, graphs=_FILES, verification={}, vocabulary=vocabulary).write(work)
        verification = {
            precision: verify(model, work, model_path, precision, windows, max_positions) for precision in _FILES
        }
        manifest = ExportManifest(opset=OPSET, graphs=_FILES, verification=verification, vocabulary=vocabulary)
        manifest.write(work)
        float32 = verification["float32"]
        if float32["max_log_prob_difference"] > FLOAT32_TOLERANCE:
            raise ConversionError(
                f"the float32 graphs differ from the PyTorch drafter by up to "
                f"{float32['max_log_prob_difference']:.2e} in log-probability "
                f"(allowed {FLOAT32_TOLERANCE:.0e}); nothing was written"
            )
        os.makedirs(output_dir, exist_ok=True)
        for name in os.listdir(work):
            shutil.copyfile(os.path.join(work, name), os.path.join(output_dir, name))
    return manifest


def export_graphs(model, directory: str) -> None:
    """Write the float32 and int8 graphs of ``model`` (a ``FlashDrafterModel``) into ``directory``."""
    for name, graph in _graphs(model).items():
        _write_graph(directory, name, *graph)


def _graphs(model) -> dict:
    """Name -> (module, example inputs, input names, output names, dynamic axes) of each graph."""
    import torch

    from ct2_flash.converters.graphs import AudioKeys, HistoryKeys, ProposeBlock, cache_names

    config = model.config
    d, layers = config.d_model, config.num_layers
    audio_names, history_names = cache_names("audio", layers), cache_names("history", layers)
    encoder_output = torch.randn(1, 12, d)
    states, positions = torch.randn(3, config.history_dim), torch.arange(4, 7)
    with torch.no_grad():
        audio = AudioKeys(model)(encoder_output)
        history = HistoryKeys(model)(states, positions)
    return {
        "audio": (
            AudioKeys(model),
            (encoder_output,),
            ["encoder_output"],
            audio_names,
            {"encoder_output": {1: "frames"}, **{name: {1: "frames"} for name in audio_names}},
        ),
        "history": (
            HistoryKeys(model),
            (states, positions),
            ["states", "positions"],
            history_names,
            {"states": {0: "rows"}, "positions": {0: "rows"}, **{name: {0: "rows"} for name in history_names}},
        ),
        "propose": (
            ProposeBlock(model),
            (torch.randn(1, d), torch.arange(7, 8 + config.num_draft_tokens), *history, *audio),
            ["anchor_embedding", "positions", *history_names, *audio_names],
            ["tokens", "log_probs", "logits"],
            {
                "positions": {0: "rows"},
                **{name: {0: "drafts"} for name in ("tokens", "log_probs", "logits")},
                **{name: {0: "history_length"} for name in history_names},
                **{name: {1: "frames"} for name in audio_names},
            },
        ),
    }


def _write_graph(directory: str, name: str, module, args, inputs, outputs, dynamic) -> None:
    """Export one graph at float32 (its large weights stored as float16) and its int8 quantization."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    float32_path = os.path.join(directory, _FILES["float32"][name])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            args,
            float32_path,
            dynamo=False,
            opset_version=OPSET,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
        )
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic logs advice at WARNING on the root logger
    try:
        quantize_dynamic(float32_path, os.path.join(directory, _FILES["int8"][name]), weight_type=QuantType.QInt8)
    finally:
        logging.getLogger().setLevel(quiet)
    onnx.save(_float16_storage(onnx.load(float32_path)), float32_path)


def _float16_storage(graph_model):
    """Store large float32 initializers as float16 followed by a Cast to float32.

    ONNX Runtime folds the Casts when it loads the graph, so the arithmetic stays float32; only
    the file is half the size (the weights were float16-rounded already, so nothing is lost).
    """
    import onnx
    from onnx import helper, numpy_helper

    graph = graph_model.graph
    casts = []
    for initializer in graph.initializer:
        if initializer.data_type != onnx.TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(initializer)
        if values.size < _FLOAT16_STORAGE_MIN:
            continue
        name = initializer.name
        initializer.CopyFrom(numpy_helper.from_array(values.astype(np.float16), f"{name}__float16"))
        casts.append(helper.make_node("Cast", [f"{name}__float16"], [name], to=onnx.TensorProto.FLOAT))
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(casts + nodes)
    onnx.checker.check_model(graph_model)
    return graph_model


def validation_windows(model_path: str, audio_paths: Sequence[str]) -> List[ValidationWindow]:
    """Decode the first 30 s of each file greedily with the target (float32) and recover its
    states, as the loop hands them to a drafter."""
    import ctranslate2
    from faster_whisper import WhisperModel, decode_audio
    from faster_whisper.tokenizer import Tokenizer

    from ct2_flash.loop.target import TargetRuntime
    from ct2_flash.loop.vocabulary import load_config, load_vocabulary

    whisper = WhisperModel(model_path, compute_type="float32", cpu_threads=2)
    special, _ = load_vocabulary(model_path)
    config = load_config(model_path)
    runtime = TargetRuntime(
        whisper.model, model_path, special, config.get("suppress_ids", ()), config.get("suppress_ids_begin", ())
    )
    tokenizer = Tokenizer(whisper.hf_tokenizer, whisper.model.is_multilingual, task="transcribe", language="en")
    prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    windows = []
    for path in audio_paths:
        frames = whisper.feature_extractor.nb_max_frames
        features = whisper.feature_extractor(decode_audio(path))[..., :frames]
        features = np.pad(features, ((0, 0), (0, frames - features.shape[-1])))
        encoder_output = whisper.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])))
        tokens = whisper.model.generate(encoder_output, [prompt], beam_size=1)[0].sequences_ids[0]
        if len(tokens) < 2:
            continue
        prefill = runtime.start(encoder_output, prompt)
        logits = prefill.sequence.verify(tokens[:-1])  # rows after each of the first T - 1 tokens
        states = runtime.decoder_states(np.concatenate([prefill.next_logits[None], logits]))
        windows.append(ValidationWindow(np.array(encoder_output)[0], tuple(prompt), list(tokens), states))
    if not windows:
        raise ConversionError(f"no validation window: the target decoded fewer than 2 tokens from {list(audio_paths)}")
    return windows


def verify(
    model, directory: str, model_path: str, precision: str, windows: Sequence[ValidationWindow], max_positions: int
) -> dict:
    """Run the PyTorch drafter (float32) and the exported graphs side by side, anchor by anchor.

    Successive anchors ask for K, 1, 2, .. K - 1, K, 1, .. drafts, so blocks of every length
    the loop may ask for are checked, the full block at every K-th anchor.

    Returns:
        {"positions" (anchors), "top1_agreement" (all proposed tokens),
        "top1_agreement_by_position" (by draft position, over the anchors that proposed it),
        "max_log_prob_difference"}: the last is over tokens where both chose the same.
    """
    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.drafting.flash_drafter import FlashDrafter
    from ct2_flash.loop.options import DecodingOptions

    reference = FlashDrafter(model, precision="float32", min_confidence=0.0)
    exported = OnnxDrafter(directory, model_path, precision=precision, min_confidence=0.0)
    k = model.config.num_draft_tokens
    agree, proposed, worst, anchors = np.zeros(k), np.zeros(k), 0.0, 0
    for window in windows:
        draft_window = DraftWindow(window.encoder_output, window.prompt, DecodingOptions(), eot=-1)
        for drafter in (reference, exported):
            drafter.begin(draft_window)
        for i in range(len(window.tokens) - 1):
            if anchors >= max_positions:
                break
            rows = anchors % k or k
            proposals = []
            for drafter in (reference, exported):
                drafter.advance(window.states[i : i + 1], len(window.prompt) + i)
                proposals.append(drafter.propose(window.tokens[: i + 1], rows))
            lengths = {len(proposal.tokens) for proposal in proposals}
            if lengths != {rows}:
                raise ConversionError(
                    f"asked for {rows} drafts, the {precision} graphs and PyTorch proposed "
                    f"{len(proposals[1].tokens)} and {len(proposals[0].tokens)}"
                )
            same = np.array(proposals[0].tokens) == np.array(proposals[1].tokens)
            agree[:rows] += same
            proposed[:rows] += 1
            anchors += 1
            difference = np.abs(np.array(proposals[0].log_probs) - np.array(proposals[1].log_probs))[same]
            worst = max(worst, float(difference.max(initial=0.0)))
    by_position = (agree / np.maximum(proposed, 1)).round(4).tolist()
    result = {
        "positions": anchors,
        "top1_agreement": round(float(agree.sum() / max(proposed.sum(), 1)), 4),
        "top1_agreement_by_position": by_position,
        "max_log_prob_difference": worst,
    }
    logger.info(
        "%s graphs vs PyTorch on %d anchors: top-1 agreement %.2f%%, max log-prob difference %.2e",
        precision,
        anchors,
        100 * result["top1_agreement"],
        worst,
    )
    return result


def _bundled_sample() -> str:
    from ct2_flash.adapter.audio import SAMPLE_AUDIO

    return SAMPLE_AUDIO
