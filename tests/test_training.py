"""A training smoke run: teacher extraction on two committed clips, a few fit steps, resume."""

import dataclasses
import json
import os

import numpy as np
import pytest

pytest.importorskip("torch")

from ct2_flash.drafting.flash_drafter import load_checkpoint  # noqa: E402
from ct2_flash.train.extract import extract  # noqa: E402
from ct2_flash.train.fit import FitConfig, fit, load_examples, make_batch, position_weights, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, clips):
    """A data directory laid out as the synth step writes it, from two test clips."""
    root = tmp_path_factory.mktemp("drafter_data")
    (root / "audio").mkdir()
    with open(root / "manifest.jsonl", "w", encoding="utf-8") as manifest:
        for index, (name, split) in enumerate([("clip08_slt.ogg", "train"), ("clip09_kal16.ogg", "validation")]):
            audio = (clips[name] * 32767).astype(np.int16)
            np.save(root / "audio" / f"utt{index:06d}.npy", audio)
            manifest.write(
                json.dumps(
                    {"id": f"utt{index:06d}", "split": split, "voice": name, "text": "", "seconds": audio.size / 16000}
                )
                + "\n"
            )
    assert extract(str(root), progress=False) == 2
    assert extract(str(root), progress=False) == 0  # resumes: nothing left
    return str(root)


def test_teacher_data_layout(teacher_dir):
    (example,) = load_examples(teacher_dir, "train")
    # A training utterance keeps the frames the drafter reads; a validation one all of them,
    # which the target verifies against.
    assert example.audio_frames + 50 < 1500
    assert example.encoder_output.shape == (example.audio_frames + 50, 384)
    (held_out,) = load_examples(teacher_dir, "validation")
    assert held_out.encoder_output.shape == (1500, 384)
    assert example.states.shape == (len(example.tokens), 384)
    assert example.tokens[-1] == 50256  # the target's own end-of-text closes the labels


def test_batch_labels_follow_their_anchor(teacher_dir):
    (example,) = load_examples(teacher_dir, "train")
    batch = make_batch([example], k=8, blocks=16, rng=np.random.default_rng(0))
    for slot in range(16):
        visible = int(batch["visible"][0, slot])
        anchor = int(batch["anchors"][0, slot])
        assert anchor == example.tokens[visible - 1]  # the anchor is y_a, history has states 0..a
        expected = list(example.tokens[visible : visible + 8])
        labels = [t for t in batch["labels"][0, slot].tolist() if t >= 0]
        assert labels == expected
    # exp(-(j-1)/4), written out: the first position counts fully, the fifth a third as much.
    expected = [1.0, 0.7788, 0.6065, 0.4724, 0.3679, 0.2865, 0.2231, 0.1738]
    np.testing.assert_allclose(position_weights(8).numpy(), expected, atol=1e-4)


def test_fit_few_steps_and_resume(teacher_dir, model_path, tmp_path):
    config = FitConfig(
        steps=3,
        batch_size=1,
        blocks_per_utterance=4,
        warmup_steps=1,
        validate_every=3,
        save_every=2,
        validation_windows=1,
    )
    out = str(tmp_path / "run")
    meta = fit(teacher_dir, out, config, shortlist_size=4096, progress=False)
    assert meta["step"] == 3 and len(meta["losses"]) == 3 and len(meta["validations"]) == 1
    assert all(np.isfinite(meta["losses"]))
    drafter = load_checkpoint(os.path.join(out, "best"), model_path)
    assert drafter.config.shortlist_size == 4096 and int(drafter.shortlist.max()) == 51863
    assert drafter.config.causal_blocks and meta["causal_blocks_from_step"] == 0
    # Resume: a longer run continues from step 3 instead of starting again. This one is made
    # to look like a run saved before causal blocks existed: it switches and records the step.
    state = os.path.join(out, "train_state.json")
    with open(state, encoding="utf-8") as stream:
        saved = json.load(stream)
    del saved["causal_blocks_from_step"]
    with open(state, "w", encoding="utf-8") as stream:
        json.dump(saved, stream)
    longer = FitConfig(**{**config.__dict__, "steps": 4})
    meta = fit(teacher_dir, out, longer, shortlist_size=4096, progress=False)
    assert meta["step"] == 4 and len(meta["losses"]) == 4 and meta["causal_blocks_from_step"] == 3
    # A snapshot is the latest saved state (step 4) with the run's architecture, causal blocks included.
    import torch
    from safetensors.torch import load_file

    saved = load_file(os.path.join(out, "train_state.safetensors"))
    copy = load_checkpoint(snapshot(out, str(tmp_path / "snapshot")), model_path)
    assert copy.config.causal_blocks and copy.config.shortlist_size == 4096
    weights = copy.state_dict()
    trained = {name[len("model.") :]: tensor for name, tensor in saved.items() if name.startswith("model.")}
    assert "mask_embedding" in trained and len(trained) > 10
    assert all(torch.equal(weights[name], tensor) for name, tensor in trained.items())
    with pytest.raises(FileNotFoundError, match="no saved training state"):
        snapshot(str(tmp_path / "nothing"), str(tmp_path / "nowhere"))
    assert meta["train_ids"] == ["utt000000"] and meta["validation_ids"] == ["utt000001"]


def test_fit_from_a_checkpoint_keeps_its_shortlist(teacher_dir, model_path, tmp_path):
    config = FitConfig(
        steps=2, batch_size=1, blocks_per_utterance=4, warmup_steps=1, validate_every=2, validation_windows=1
    )
    first = str(tmp_path / "first")
    fit(teacher_dir, first, config, shortlist_size=4096, progress=False)
    start = load_checkpoint(os.path.join(first, "best"), model_path)
    second = str(tmp_path / "second")
    # A different shortlist size is ignored: the head must stay the one the weights were trained for.
    meta = fit(teacher_dir, second, config, shortlist_size=2048, progress=False, init_from=os.path.join(first, "best"))
    assert meta["init_from"] == os.path.join(first, "best") and meta["step"] == 2
    tuned = load_checkpoint(snapshot(second, str(tmp_path / "latest")), model_path)
    assert tuned.shortlist.tolist() == start.shortlist.tolist()
    assert not all(np.array_equal(a, b) for a, b in zip(tuned.state_dict().values(), start.state_dict().values()))
    # The starting checkpoint is scored before the first step: the best is never worse than it.
    assert [v["step"] for v in meta["validations"]] == [0, 2]
    assert meta["best"] == max(v["mean_accepted_length"] for v in meta["validations"])
    with pytest.raises(ValueError, match="use_audio=False"):
        fit(
            teacher_dir,
            str(tmp_path / "third"),
            config,
            progress=False,
            init_from=os.path.join(first, "best"),
            use_audio=False,
        )


def test_teacher_distribution_and_audio_frames(teacher_dir, clips):
    (example,) = load_examples(teacher_dir, "train")
    assert example.top_ids.shape == (len(example.tokens), 16)
    # The greedy token is the target's raw argmax unless a logit rule removed it (timestamps).
    in_top = np.mean([t in row for t, row in zip(example.tokens, example.top_ids)])
    assert in_top > 0.9
    assert np.all(np.exp(example.top_log_probs.astype(np.float64)).sum(axis=1) <= 1.0 + 1e-2)
    seconds = clips["clip08_slt.ogg"].size / 16000
    assert abs(example.audio_frames - seconds * 50) <= 2  # 50 encoder frames per second


def test_batches_read_the_audio_frames_and_the_padding_the_runtime_sees(teacher_dir):
    from ct2_flash.drafting.audio_window import PADDING_FRAMES_SEEN

    (example,) = load_examples(teacher_dir, "train")
    batch = make_batch([example], k=8, blocks=16, rng=np.random.default_rng(0))
    assert batch["encoder"].shape[1] == example.audio_frames + PADDING_FRAMES_SEEN
    np.testing.assert_array_equal(batch["encoder"][0].numpy(), example.encoder_output[: batch["encoder"].shape[1]])
    unknown = dataclasses.replace(example, audio_frames=None)
    assert make_batch([unknown], k=8, blocks=4, rng=np.random.default_rng(0))["encoder"].shape[1] == 1500


def test_distillation_on_a_one_hot_teacher_is_the_cross_entropy(teacher_dir, model_path):
    import torch

    from ct2_flash.drafting.flash_drafter import target_identity
    from ct2_flash.drafting.flash_model import DrafterConfig, FlashDrafterModel
    from ct2_flash.train.fit import IGNORE, loss_of

    (example,) = load_examples(teacher_dir, "train")
    batch = make_batch([example], k=8, blocks=16, rng=np.random.default_rng(0))
    from ct2_flash.engine.model_files import CT2ModelFile

    model = FlashDrafterModel(DrafterConfig(target=target_identity(model_path, "tiny.en"), shortlist_size=51864))
    model.init_from_target(CT2ModelFile(model_path))  # not uniform: every distribution scores differently
    model.shortlist.copy_(torch.arange(51864))
    full_to_short = torch.arange(51864)
    labels = batch["labels"]
    one_hot = dict(
        batch,
        soft_ids=labels.clamp(min=0)[..., None].expand(-1, -1, -1, 2).contiguous(),
        soft_log_probs=torch.tensor([0.0, float("-inf")]).expand(*labels.shape, 2).contiguous(),
    )
    with torch.no_grad():
        plain = loss_of(model, batch, full_to_short)
        distilled = loss_of(model, one_hot, full_to_short, kl_weight=1.0)
        real = loss_of(model, batch, full_to_short, kl_weight=1.0)
    assert float(distilled) == pytest.approx(2 * float(plain), rel=1e-5)
    assert np.isfinite(float(real)) and float(real) != pytest.approx(float(distilled))
    assert IGNORE < 0
    with pytest.raises(ValueError, match="rerun the extract step"):
        bare = {k: v for k, v in batch.items() if not k.startswith("soft")}
        loss_of(model, bare, full_to_short, kl_weight=1.0)


def test_batches_by_length_come_from_one_neighbourhood_and_cover_every_utterance():
    from ct2_flash.train.fit import sample_batch

    by_length = list(np.random.default_rng(1).permutation(100))  # sorted order of utterance ids
    seen = set()
    for step in range(400):
        batch = sample_batch(by_length, 8, np.random.default_rng([0, step]))
        places = sorted(by_length.index(i) for i in batch)
        assert len(batch) == 8 and places[-1] - places[0] < 32
        seen.update(batch)
    assert seen == set(by_length)
    assert (
        sample_batch(by_length[:3], 8, np.random.default_rng(0))
        and len(sample_batch(by_length[:3], 8, np.random.default_rng(0))) == 8
    )


def test_attended_frames_point_inside_the_speech_and_advance(teacher_dir):
    """The AnchorDraft targets: the frame the target reads for each text token lies inside the
    clip's audio and moves forward through it."""
    (example,) = load_examples(teacher_dir, "train")
    frames = example.attended_frames.astype(int)
    text = np.asarray(example.tokens) < 50256  # not end-of-text or timestamps
    assert frames.shape == example.tokens.shape
    assert np.all(frames[text] <= example.audio_frames)  # the last word may read the frame at the audio's end
    steps = np.diff(frames[text])
    assert np.mean(steps >= -5) > 0.9 and frames[text][-1] > frames[text][0]


def test_batches_read_the_runtime_window_around_the_anchor_position(teacher_dir):
    """Each block's cross-attention mask is the slice the runtime drafter reads for that anchor
    (all of the utterance's frames for the first anchor, which no verification placed yet), and
    the AnchorDraft labels are the target's frames for the block's labels."""
    from ct2_flash.drafting.audio_window import audio_window_span
    from ct2_flash.train.fit import drafter_frames

    (example,) = load_examples(teacher_dir, "train")
    k, window = 8, (50, 150)
    own = drafter_frames(example, 1500)
    for seed in range(3):
        batch = make_batch([example], k=k, blocks=16, rng=np.random.default_rng(seed), audio_window=window)
        mask = batch["cross_mask"][0].numpy().reshape(16, k + 1, -1)
        assert (mask == mask[:, :1]).all()  # every token of a block reads the same frames
        for slot in range(16):
            a = int(batch["visible"][0, slot]) - 1
            read = np.flatnonzero(mask[slot, 0])
            start, stop = (0, own) if a == 0 else audio_window_span(int(example.attended_frames[a]), own, window)
            assert read.tolist() == list(range(start, stop))
            labels = batch["label_frames"][0, slot].numpy()
            follow = example.attended_frames[a + 1 : a + 1 + k]
            assert labels[: len(follow)].tolist() == follow.tolist() and (labels[len(follow) :] == -1).all()
    whole = make_batch([example], k=k, blocks=4, rng=np.random.default_rng(0))
    assert whole["cross_mask"][0].numpy()[:, :own].all() and not whole["cross_mask"][0].numpy()[:, own:].any()


def test_anchor_loss_is_zero_on_the_target_frame_and_log_frames_when_uniform():
    import torch

    from ct2_flash.train.fit import ANCHOR_RADIUS, anchor_loss

    frames = 100
    labels = torch.tensor([[[10, 50, -1]]])  # [B, N, K]
    on_target = torch.zeros(1, 1, 3, frames)
    on_target[0, 0, 0, 10] = on_target[0, 0, 1, 51] = on_target[0, 0, 2, 90] = 1.0
    assert float(anchor_loss(on_target, labels)) == pytest.approx(0.0, abs=1e-6)
    uniform = torch.full((1, 1, 3, frames), 1.0 / frames)
    width = 2 * ANCHOR_RADIUS + 1
    assert float(anchor_loss(uniform, labels)) == pytest.approx(np.log(frames / width), rel=1e-5)
    far = torch.zeros(1, 1, 3, frames)
    far[..., 99] = 1.0
    assert float(anchor_loss(far, labels)) > 10  # no mass near the target: a large loss, not nan


def test_a_resumed_run_keeps_its_utterances_unless_it_grows(teacher_dir, tmp_path):
    """Teacher data extracted after a run started joins it only with ``grow`` (recorded with
    the step it joined at); the validation utterances never change."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(teacher_dir, data)
    config = FitConfig(
        steps=2,
        batch_size=1,
        blocks_per_utterance=4,
        warmup_steps=1,
        validate_every=100,
        save_every=1,
        validation_windows=1,
    )
    out = str(tmp_path / "run")
    fit(str(data), out, config, shortlist_size=4096, progress=False)
    shutil.copy(data / "teacher" / "utt000000.npz", data / "teacher" / "utt000002.npz")
    with open(data / "teacher.jsonl", encoding="utf-8") as stream:
        record = next(r for r in map(json.loads, stream) if r["id"] == "utt000000")
    with open(data / "teacher.jsonl", "a", encoding="utf-8") as stream:
        stream.write(json.dumps({**record, "id": "utt000002"}) + "\n")
    meta = fit(str(data), out, FitConfig(**{**config.__dict__, "steps": 3}), shortlist_size=4096, progress=False)
    assert meta["train_ids"] == ["utt000000"] and "data_growth" not in meta
    meta = fit(
        str(data), out, FitConfig(**{**config.__dict__, "steps": 4}), shortlist_size=4096, progress=False, grow=True
    )
    assert meta["train_ids"] == ["utt000000", "utt000002"] and meta["train_utterances"] == 2
    assert meta["data_growth"] == [{"step": 3, "train_utterances": 2}] and meta["validation_ids"] == ["utt000001"]


def test_a_second_copy_of_a_step_on_one_directory_fails_at_once(tmp_path):
    """Two extract processes on one directory wrote every teacher file twice: a step holds a
    lock while it runs, and a second copy (another process) stops with the reason."""
    import subprocess
    import sys

    from ct2_flash.train.step_lock import step_lock

    code = (
        "import sys\nfrom ct2_flash.train.step_lock import step_lock\n"
        "try:\n    with step_lock(sys.argv[1], 'extract'):\n        pass\n"
        "except RuntimeError as error:\n    print(error)\n    sys.exit(3)\n"
    )
    with step_lock(str(tmp_path), "extract"):
        second = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
        assert second.returncode == 3 and "another 'extract' step is already running" in second.stdout
        other_step = subprocess.run([sys.executable, "-c", code.replace("'extract'", "'fit'"), str(tmp_path)])
        assert other_step.returncode == 0
    after = subprocess.run([sys.executable, "-c", code, str(tmp_path)])
    assert after.returncode == 0  # released when the step ends


def test_a_resumed_run_scores_with_its_saved_shortlist(teacher_dir, tmp_path, monkeypatch):
    """The shortlist is counted from the data when a run starts; a resumed run keeps the saved
    one even when the data (grown since) would now give another order, and its loss is the
    one an unchanged resume gives."""
    import shutil

    import ct2_flash.train.fit as fit_module

    config = FitConfig(
        steps=2,
        batch_size=1,
        blocks_per_utterance=4,
        warmup_steps=1,
        validate_every=100,
        save_every=1,
        validation_windows=1,
    )
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    fit(teacher_dir, first, config, shortlist_size=4096, progress=False)
    shutil.copytree(first, second)
    longer = FitConfig(**{**config.__dict__, "steps": 3})
    unchanged = fit(teacher_dir, first, longer, shortlist_size=4096, progress=False)
    counted = fit_module.shortlist_from
    monkeypatch.setattr(fit_module, "shortlist_from", lambda *args, **kwargs: counted(*args, **kwargs)[::-1].copy())
    recounted = fit(teacher_dir, second, longer, shortlist_size=4096, progress=False)
    assert recounted["losses"][-1] == unchanged["losses"][-1]


def test_validation_on_real_speech_chooses_the_checkpoint(teacher_dir, tmp_path):
    """With recordings to validate on, every validation also runs on their first windows, the
    best checkpoint is chosen by them, and the report shows both curves; a resumed run that
    starts validating on real speech chooses afresh."""
    from ct2_flash.train.report import write_report
    from tests.conftest import DATA

    manifest = tmp_path / "real.tsv"
    manifest.write_text("".join(f"{os.path.join(DATA, name)}\t\n" for name in ("clip00_kal16.ogg", "clip03_rms.ogg")))
    config = FitConfig(
        steps=2,
        batch_size=1,
        blocks_per_utterance=4,
        warmup_steps=1,
        validate_every=1,
        save_every=1,
        validation_windows=2,
    )  # of three recordings: the first and the last
    manifest.write_text(
        "".join(f"{os.path.join(DATA, name)}\t\n" for name in ("clip00_kal16.ogg", "clip01_slt.ogg", "clip03_rms.ogg"))
    )
    out = str(tmp_path / "run")
    meta = fit(teacher_dir, out, config, shortlist_size=4096, progress=False)
    assert meta["best_by"] == "validation" and "real" not in meta["validations"][-1]
    longer = FitConfig(**{**config.__dict__, "steps": 3})
    meta = fit(teacher_dir, out, longer, shortlist_size=4096, progress=False, real_speech=[str(manifest)])
    real = meta["validations"][-1]["real"]
    assert meta["best_by"] == "real" and real["windows"] == 2 and real["tokens_per_call"] > 0
    assert meta["real_speech"] == ["clip00_kal16.ogg", "clip03_rms.ogg"]
    assert meta["best"] == real["mean_accepted_length"]  # the first real score is the best so far
    report = open(write_report(teacher_dir, out, str(tmp_path / "report")), encoding="utf-8").read()
    assert "chosen by real speech" in report and "first windows of 2 recordings" in report
    # A new run trains causal blocks from its first step, and its report says so.
    assert (
        meta["causal_blocks_from_step"] == 0
        and "causal blocks (a row reads the rows before it) from the start" in report
    )


def test_damaged_teacher_files_are_skipped_and_counted(teacher_dir, tmp_path, monkeypatch):
    """A truncated teacher file is skipped when the run loads, one that stops reading during the
    run is dropped at the batch that needs it; both are named in the run's record and report."""
    import shutil

    import ct2_flash.train.fit as fit_module
    from ct2_flash.train.report import write_report

    data = tmp_path / "data"
    shutil.copytree(teacher_dir, data)
    with open(data / "teacher.jsonl", encoding="utf-8") as stream:
        record = next(r for r in map(json.loads, stream) if r["id"] == "utt000000")
    with open(data / "manifest.jsonl", encoding="utf-8") as stream:
        entry = next(e for e in map(json.loads, stream) if e["id"] == "utt000000")
    for name in ("utt000002", "utt000003"):
        shutil.copy(data / "teacher" / "utt000000.npz", data / "teacher" / f"{name}.npz")
        with open(data / "teacher.jsonl", "a", encoding="utf-8") as stream:
            stream.write(json.dumps({**record, "id": name}) + "\n")
        with open(data / "manifest.jsonl", "a", encoding="utf-8") as stream:
            stream.write(json.dumps({**entry, "id": name}) + "\n")
    whole = (data / "teacher" / "utt000002.npz").read_bytes()
    (data / "teacher" / "utt000002.npz").write_bytes(whole[: len(whole) // 3])  # truncated
    reading = fit_module.Example.encoder_output.fget

    def fails_for_utt3(example):
        if example.path.endswith("utt000003.npz"):
            raise OSError("CRC check failed")
        return reading(example)

    monkeypatch.setattr(fit_module.Example, "encoder_output", property(fails_for_utt3))
    config = FitConfig(
        steps=4,
        batch_size=2,
        blocks_per_utterance=4,
        warmup_steps=1,
        validate_every=100,
        save_every=1,
        validation_windows=1,
    )
    out = str(tmp_path / "run")
    meta = fit(str(data), out, config, shortlist_size=4096, progress=False)
    assert meta["step"] == 4 and meta["skipped_files"] == ["utt000002.npz", "utt000003.npz"]
    report = open(write_report(str(data), out, str(tmp_path / "report")), encoding="utf-8").read()
    assert "teacher files skipped as damaged: 2 (utt000002.npz, utt000003.npz)" in report
