"""The exported draft round: converter round trip, ONNX Runtime against PyTorch, bad files."""

import dataclasses
import json
import logging
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from ct2_flash.converters import convert_drafter  # noqa: E402
from ct2_flash.converters.drafter import FLOAT32_TOLERANCE, validation_windows, verify  # noqa: E402
from ct2_flash.drafting.files import SHIPPED_DRAFTERS, CheckpointError, DrafterMismatchError, target_identity  # noqa: E402
from ct2_flash.drafting.flash_drafter import load_checkpoint, save_checkpoint  # noqa: E402
from ct2_flash.drafting.flash_model import DrafterConfig, FlashDrafterModel  # noqa: E402
from ct2_flash.drafting.onnx_drafter import EXPORT_FILE, OnnxDrafter, file_digest  # noqa: E402
from ct2_flash.engine.model_files import CT2ModelFile  # noqa: E402

from .conftest import CLIP_PATHS, LONG_PATH, segments_of  # noqa: E402

SHIPPED = os.path.join(SHIPPED_DRAFTERS, "tiny.en")


@pytest.fixture(scope="module")
def random_checkpoint(model_path, tmp_path_factory):
    """A one-layer drafter for tiny.en with random weights and a 512-token shortlist."""
    config = DrafterConfig(
        target=target_identity(model_path, "tiny.en"), num_layers=1, shortlist_size=512, causal_blocks=True
    )
    torch.manual_seed(0)
    model = FlashDrafterModel(config)
    model.init_from_target(CT2ModelFile(model_path))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05 * parameter.std().clamp(min=0.1))
        model.shortlist.copy_(torch.sort(torch.randperm(50256)[:512]).values)
    directory = str(tmp_path_factory.mktemp("random_checkpoint"))
    save_checkpoint(model, directory)
    return directory


@pytest.fixture(scope="module")
def converted(random_checkpoint, model_path, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("converted") / "drafter")
    manifest = convert_drafter(random_checkpoint, out, model_path, audio=[LONG_PATH], max_positions=60)
    return out, manifest


def test_converter_round_trip(converted):
    out, manifest = converted
    files = set(os.listdir(out))
    assert {"drafter.json", "drafter.safetensors", EXPORT_FILE} <= files
    for precision in ("float32", "int8"):
        assert set(manifest.graphs[precision].values()) <= files
    float32, int8 = manifest.verification["float32"], manifest.verification["int8"]
    assert float32["positions"] > 10
    assert float32["top1_agreement"] == 1.0
    assert float32["max_log_prob_difference"] <= FLOAT32_TOLERANCE
    # int8 is reported, not required: quantised weights may pick another top token.
    assert 0.0 <= int8["top1_agreement"] <= 1.0 and len(int8["top1_agreement_by_position"]) == 8
    stored = json.load(open(os.path.join(out, EXPORT_FILE)))
    assert stored["opset"] == manifest.opset and stored["verification"]["float32"] == float32


def test_converter_refuses_to_overwrite_without_force(converted, random_checkpoint, model_path):
    out, _ = converted
    with pytest.raises(FileExistsError, match="--force"):
        convert_drafter(random_checkpoint, out, model_path, audio=[CLIP_PATHS[0]])


def test_cli_converts(random_checkpoint, model_path, tmp_path, capsys):
    from ct2_flash.cli import main

    out = str(tmp_path / "cli")
    assert main(["convert-drafter", random_checkpoint, out, "--model", model_path, "--audio", CLIP_PATHS[1]]) == 0
    assert "float32: top-1 agreement with PyTorch 100.00%" in capsys.readouterr().out
    assert main(["convert-drafter", random_checkpoint, out, "--model", model_path]) == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.isfile(os.path.join(SHIPPED, EXPORT_FILE)), reason="no shipped drafter")
def test_onnx_round_gives_the_pytorch_proposals_for_the_shipped_drafter(model_path):
    """The shipped float32 graphs against the PyTorch drafter, anchor by anchor, on test clips."""
    model = load_checkpoint(SHIPPED, model_path)
    windows = validation_windows(model_path, [CLIP_PATHS[2], CLIP_PATHS[5]])
    result = verify(model, SHIPPED, model_path, "float32", windows, max_positions=120)
    assert result["positions"] > 30
    assert result["top1_agreement"] == 1.0
    assert result["max_log_prob_difference"] <= FLOAT32_TOLERANCE


def test_float32_graphs_keep_the_transcript_exact(float32_pair, clips, converted, model_path):

    out, _ = converted
    flash = float32_pair.flash
    with flash.use_drafter(OnnxDrafter(out, model_path, precision="float32", min_confidence=0.0)):
        flash.reset_spec_stats()
        for name in ("clip03_rms.ogg", "clip08_slt.ogg"):
            assert segments_of(flash, clips[name], beam_size=1) == float32_pair.reference(
                name, clips[name], beam_size=1
            )
        assert flash.spec_stats.proposed > 0


def _copy(source, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(source, target)
    return str(target)


def test_bad_files_fail_at_load_with_the_file_and_the_fix(converted, model_path, tmp_path):
    out, manifest = converted
    propose = manifest.graphs["int8"]["propose"]

    # Refused at construction by the digests export.json records, before ONNX Runtime opens
    # anything: a truncated graph, and one with a byte changed inside its weights (which
    # ONNX Runtime would load).
    truncated = _copy(out, tmp_path, "truncated")
    path = os.path.join(truncated, propose)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=rf"(?s){propose} is damaged.*convert-drafter"):
        OnnxDrafter(truncated, model_path)
    flipped = _copy(out, tmp_path, "flipped")
    path = os.path.join(flipped, propose)
    data = bytearray(open(path, "rb").read())
    data[-1000] ^= 0x10
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match=rf"(?s){propose} is damaged.*convert-drafter"):
        OnnxDrafter(flipped, model_path)

    # A drafter converted before digests were recorded: ONNX Runtime opens it at construction,
    # and its load is the check.
    undigested = _copy(truncated, tmp_path, "undigested")
    record = json.load(open(os.path.join(undigested, EXPORT_FILE)))
    del record["digests"]
    json.dump(record, open(os.path.join(undigested, EXPORT_FILE), "w"))
    with pytest.raises(CheckpointError, match=rf"(?s)cannot load drafter graph .*{propose}.*convert-drafter"):
        OnnxDrafter(undigested, model_path)

    missing = _copy(out, tmp_path, "missing")
    os.remove(os.path.join(missing, propose))
    with pytest.raises(CheckpointError, match=rf"{propose} is missing.*convert-drafter"):
        OnnxDrafter(missing, model_path)

    no_manifest = _copy(out, tmp_path, "no_manifest")
    os.remove(os.path.join(no_manifest, EXPORT_FILE))
    with pytest.raises(CheckpointError, match="no exported graphs.*convert-drafter"):
        OnnxDrafter(no_manifest, model_path)

    # A newer converter's opset (in the graph and the manifest, digests matching): opened at
    # construction, where ONNX Runtime refuses it.
    future = _copy(out, tmp_path, "future_opset")
    graph = onnx.load(os.path.join(future, propose))
    graph.opset_import[0].version = 99  # an opset no installed ONNX Runtime implements
    onnx.save(graph, os.path.join(future, propose))
    record = json.load(open(os.path.join(future, EXPORT_FILE)))
    record["opset"] = 99
    record["digests"]["int8"]["propose"] = file_digest(os.path.join(future, propose))
    json.dump(record, open(os.path.join(future, EXPORT_FILE), "w"))
    with pytest.raises(CheckpointError, match=r"(?s)cannot load drafter graph.*upgrade onnxruntime"):
        OnnxDrafter(future, model_path)

    # A vocabulary that does not fit the proposal graph's logits (as export.json records them,
    # and as ONNX Runtime reads them from a drafter converted before they were recorded).
    shortened = _copy(out, tmp_path, "shortened")
    record = json.load(open(os.path.join(shortened, EXPORT_FILE)))
    record["vocabulary"] = record["vocabulary"][:-1]
    json.dump(record, open(os.path.join(shortened, EXPORT_FILE), "w"))
    with pytest.raises(CheckpointError, match=r"(?s)vocabulary does not match.*convert-drafter"):
        OnnxDrafter(shortened, model_path)
    del record["interfaces"]
    json.dump(record, open(os.path.join(shortened, EXPORT_FILE), "w"))
    with pytest.raises(CheckpointError, match=r"(?s)vocabulary does not match.*convert-drafter"):
        OnnxDrafter(shortened, model_path)

    foreign = _copy(out, tmp_path, "foreign")
    config = json.load(open(os.path.join(foreign, "drafter.json")))
    config["target"]["vocab_size"] = 51865
    json.dump(config, open(os.path.join(foreign, "drafter.json"), "w"))
    with pytest.raises(DrafterMismatchError, match="vocab_size: drafter 51865 vs model 51864"):
        OnnxDrafter(foreign, model_path)


def test_a_missing_onnx_runtime_is_refused_at_construction(converted, model_path, monkeypatch):
    """The graphs open only before the loop's first window, so a missing ONNX Runtime is asked
    about at construction, where the error belongs."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "onnxruntime" else find_spec(name, *args)
    )
    with pytest.raises(ImportError, match="pip install onnxruntime"):
        OnnxDrafter(converted[0], model_path)


def test_the_graphs_open_at_the_first_window(converted, model_path):
    out, _ = converted
    drafter = OnnxDrafter(out, model_path)
    assert not drafter._sessions_open
    assert drafter.proposes_prefixes  # from the interface export.json records: the graph takes positions
    drafter.begin(_window(np.random.default_rng(0), 100))
    assert drafter._sessions_open
    drafter.advance(np.zeros((1, 384), np.float32), 2)
    assert len(drafter.propose([50257, 50362], 4).tokens) <= 4


def test_a_drafter_onnx_runtime_cannot_open_leaves_the_model_decoding(
    float32_pair, clips, converted, model_path, tmp_path, caplog
):
    """Graphs that pass the construction's checks (their digests recorded anew, as a hand edit
    would) but that ONNX Runtime cannot open: the first call about to run the loop warns once
    and goes to generate(), as does every later call with that drafter; nothing raises mid-
    transcription, and the segments are faster-whisper's."""
    out, manifest = converted
    unreadable = _copy(out, tmp_path, "unreadable")
    propose = manifest.graphs["int8"]["propose"]
    with open(os.path.join(unreadable, propose), "wb") as graph:
        graph.write(b"not an ONNX graph")
    record = json.load(open(os.path.join(unreadable, EXPORT_FILE)))
    record["digests"]["int8"]["propose"] = file_digest(os.path.join(unreadable, propose))
    json.dump(record, open(os.path.join(unreadable, EXPORT_FILE), "w"))
    drafter = OnnxDrafter(unreadable, model_path)  # passes: the digests match, nothing is opened
    with pytest.raises(CheckpointError, match=rf"cannot load drafter graph .*{propose}"):
        OnnxDrafter(unreadable, model_path).prepare()

    flash = float32_pair.flash
    names = ("clip03_rms.ogg", "clip08_slt.ogg")
    with flash.use_drafter(drafter), caplog.at_level(logging.WARNING, logger="ct2_flash"):
        flash.reset_spec_stats()
        for name in names:
            assert segments_of(flash, clips[name], beam_size=1) == float32_pair.reference(
                name, clips[name], beam_size=1
            )
        stats = flash.spec_stats
        assert stats.proposed == 0 and stats.unchanged_calls >= len(names)
    warnings = [r.getMessage() for r in caplog.records if "could not be opened" in r.getMessage()]
    assert len(warnings) == 1 and propose in warnings[0]
    # Another drafter in its place drafts again.
    with flash.use_drafter(OnnxDrafter(out, model_path)):
        flash.reset_spec_stats()
        assert segments_of(flash, clips[names[0]], beam_size=1) == float32_pair.reference(
            names[0], clips[names[0]], beam_size=1
        )
        assert flash.spec_stats.proposed > 0


def test_model_runs_a_converted_directory_without_pytorch_modules(converted, model_path):
    from ct2_flash import FlashWhisperModel

    out, _ = converted
    flash = FlashWhisperModel(model_path, stock_engine=False, compute_type="int8", drafter=out)
    assert isinstance(flash.drafter, OnnxDrafter)


def _window(rng, frames):
    """A sampled window of random audio (its proposals carry the drafter's logits; a greedy
    one's do not)."""
    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.loop.options import DecodingOptions

    return DraftWindow(
        rng.normal(size=(frames, 384)).astype(np.float32), (50257, 50362), DecodingOptions(sampling_topk=0), 50256
    )


def _sampled_pair(out, model_path, rng, frames):
    """A sampled window (``_window``) and the converted drafter ``out`` in both runtimes,
    float32, uncut."""
    from ct2_flash.drafting.flash_drafter import FlashDrafter

    window = _window(rng, frames)
    exported = OnnxDrafter(out, model_path, precision="float32", min_confidence=0.0)
    reference = FlashDrafter(load_checkpoint(out, model_path), precision="float32", min_confidence=0.0)
    return window, exported, reference


def test_history_rolls_back_like_the_pytorch_drafter(model_path, converted):
    """advance() after a rollback keeps exactly the rows before the new cache length."""
    from ct2_flash.loop.options import DecodingOptions

    out, _ = converted
    rng = np.random.default_rng(0)
    window, exported, reference = _sampled_pair(out, model_path, rng, 200)
    states = rng.normal(size=(12, 384)).astype(np.float32)
    for drafter in (exported, reference):
        drafter.begin(window)
        drafter.advance(states[:6], 7)  # the prompt's last position and 5 tokens
        drafter.advance(states[6:8], 5)  # rolled back to 3 kept, then 2 new
    a, b = exported.propose([1, 2, 3], 8), reference.propose([1, 2, 3], 8)
    assert a.tokens == b.tokens
    np.testing.assert_allclose(a.log_probs, b.log_probs, atol=1e-4)
    # The proposal distribution sampled decoding draws from: the same logits over the same
    # shortlist, whose best tokens are the proposal.
    assert a.logits.shape == b.logits.shape == (8, 512)
    np.testing.assert_array_equal(a.vocabulary, b.vocabulary)
    np.testing.assert_allclose(a.logits, b.logits, atol=1e-3)
    assert tuple(a.vocabulary[a.logits.argmax(axis=1)]) == a.tokens
    exported.begin(dataclasses.replace(window, options=DecodingOptions()))
    exported.advance(states[:6], 7)
    exported.advance(states[6:8], 5)
    greedy = exported.propose([1, 2, 3], 8)
    assert greedy.logits is None and greedy.tokens == a.tokens  # the same proposal, nothing copied out


def test_short_blocks_compute_the_rows_asked_for(model_path, converted):
    """A causal drafter's proposal of k < K drafts computes k mask rows in both runtimes, with
    the same tokens and logits, and they are the first k of the K-row proposal, whatever k
    the previous round asked for (the graph's outputs change shape between runs). The shipped,
    bidirectional drafter always computes K rows, so its short proposals are prefixes too."""
    out, _ = converted
    rng = np.random.default_rng(2)
    window, exported, reference = _sampled_pair(out, model_path, rng, 120)
    shipped = OnnxDrafter(SHIPPED, model_path, precision="float32", min_confidence=0.0, audio_window=None)
    assert exported.proposes_prefixes and reference.proposes_prefixes and not shipped.proposes_prefixes
    states = rng.normal(size=(5, 384)).astype(np.float32)
    for drafter in (exported, reference, shipped):
        drafter.begin(window)
        drafter.advance(states, 6)
    full, shipped_full = exported.propose([1, 2, 3], 8), shipped.propose([1, 2, 3], 8)
    for rows in (1, 3, 8, 2, 2, 20):
        a, b = exported.propose([1, 2, 3], rows), reference.propose([1, 2, 3], rows)
        assert a.tokens == b.tokens == full.tokens[:rows]
        assert a.logits.shape == (min(rows, 8), 512)
        np.testing.assert_allclose(a.logits, b.logits, atol=1e-3)
        np.testing.assert_allclose(a.logits, full.logits[:rows], atol=1e-4)
        assert shipped.propose([1, 2, 3], rows).tokens == shipped_full.tokens[:rows]


def test_audio_window_reads_the_frames_around_the_position(model_path, converted):
    """With ``audio_window``, a round reads the frames around where the target reads, and
    proposes what the drafter proposes for exactly those frames (audio keys are per frame)."""
    from ct2_flash.drafting.audio_window import WINDOW_STRIDE
    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.loop.options import DecodingOptions

    out, _ = converted
    rng = np.random.default_rng(1)
    audio = rng.normal(size=(1500, 384)).astype(np.float32)
    states = rng.normal(size=(6, 384)).astype(np.float32)
    windowed = OnnxDrafter(out, model_path, precision="float32", min_confidence=0.0, audio_window=(50, 150))
    whole = OnnxDrafter(out, model_path, precision="float32", min_confidence=0.0, audio_window=None)
    assert windowed.wants_position and not whole.wants_position
    windowed.begin(DraftWindow(audio, (50257, 50362), DecodingOptions(), 50256))
    windowed.advance(states, 7)
    windowed.observe_position(640)
    start, stop = windowed._audio_span
    assert start <= 640 - 50 < start + WINDOW_STRIDE and stop - 640 >= 150 and start % WINDOW_STRIDE == 0
    whole.begin(DraftWindow(audio[start:stop], (50257, 50362), DecodingOptions(), 50256))
    whole.advance(states, 7)
    a, b = windowed.propose([1, 2, 3], 8), whole.propose([1, 2, 3], 8)
    assert a.tokens == b.tokens
    np.testing.assert_allclose(a.log_probs, b.log_probs, atol=1e-5)
    # Near the end the window stays inside the audio; a short window is read whole.
    windowed.observe_position(1499)
    assert windowed._audio_span[1] == 1500 and windowed._audio_span[1] - windowed._audio_span[0] >= 200
    windowed.begin(DraftWindow(audio, (50257, 50362), DecodingOptions(), 50256, audio_frames=100))
    windowed.observe_position(80)
    assert windowed._audio_span == (0, 150)
    with pytest.raises(ValueError, match="audio_window"):
        OnnxDrafter(out, model_path, audio_window=(-1, 10))
