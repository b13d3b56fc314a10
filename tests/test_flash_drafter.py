"""The Whisper-Flash drafter network: masks, shapes, caching, checkpoints, exactness."""

import dataclasses
import json
import os

import pytest

torch = pytest.importorskip("torch")

from ct2_flash.drafting.flash_drafter import (  # noqa: E402
    CheckpointError,
    DrafterMismatchError,
    FlashDrafter,
    bfloat16_is_fast,
    check_target,
    load_checkpoint,
    save_checkpoint,
    target_identity,
)
from ct2_flash.drafting.flash_model import DrafterConfig, FlashDrafterModel, TargetIdentity, block_attention_mask  # noqa: E402
from ct2_flash.engine.model_files import CT2ModelFile  # noqa: E402

from .conftest import segments_of  # noqa: E402


def tiny_config(k=3, vocab=50, d=16) -> DrafterConfig:
    target = TargetIdentity("tiny-random", vocab_size=vocab, d_model=d, n_mels=80, tokenizer_sha256="0" * 64)
    return DrafterConfig(target=target, num_layers=2, num_heads=2, ffn_dim=32, num_draft_tokens=k, max_positions=64)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = FlashDrafterModel(tiny_config())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
        model.token_embedding.normal_()
        model.position_embedding.normal_()
    return model.eval()


def test_block_mask_sees_only_earlier_history_and_own_block():
    k, history = 2, 6
    mask = block_attention_mask(torch.tensor([[2, 5]]), torch.tensor([6]), history, k)
    assert mask.shape == (1, 2 * (k + 1), history + 2 * (k + 1))
    first, second = mask[0, : k + 1], mask[0, k + 1 :]
    # Block at anchor index 2 sees history 0, 1 only, and itself bidirectionally.
    assert first[:, :history].tolist() == [[True, True, False, False, False, False]] * (k + 1)
    assert first[:, history:].tolist() == [[True] * (k + 1) + [False] * (k + 1)] * (k + 1)
    assert second[:, :history].tolist() == [[True] * 5 + [False]] * (k + 1)
    assert second[:, history:].tolist() == [[False] * (k + 1) + [True] * (k + 1)] * (k + 1)
    # History beyond a row's valid length is never visible.
    short = block_attention_mask(torch.tensor([[5]]), torch.tensor([3]), history, k)
    assert short[0, 0, :history].tolist() == [True, True, True, False, False, False]


def test_packed_blocks_equal_separate_rounds_with_cached_history(tiny_model):
    """Training's packed pass and inference's cached rounds compute the same thing."""
    model, k = tiny_model, tiny_model.config.num_draft_tokens
    torch.manual_seed(1)
    history = torch.randn(1, 10, 16)
    encoder = torch.randn(1, 7, 16)
    anchors, anchor_index = torch.tensor([[4, 9]]), torch.tensor([[3, 8]])
    offset = 5  # text position of history index 0
    cross = model.cross_kv(encoder)
    projected = model.project_history(history)
    positions = torch.arange(10)[None] + offset
    x, block_positions = model.embed_blocks(anchors, anchor_index + offset)
    mask = block_attention_mask(anchor_index, torch.tensor([10]), 10, k)
    packed = model.forward_blocks(x, block_positions, model.history_kv(projected, positions), cross, mask)
    for n in range(2):
        t = int(anchor_index[0, n])
        cached = model.history_kv(projected[:, :t], positions[:, :t])
        xb, pb = model.embed_blocks(anchors[:, n : n + 1], anchor_index[:, n : n + 1] + offset)
        with torch.no_grad():  # inference's few-query attention path
            alone = model.forward_blocks(xb, pb, cached, cross)
        torch.testing.assert_close(packed[:, n * (k + 1) : (n + 1) * (k + 1)], alone, atol=1e-5, rtol=1e-5)
    # A block never sees history at or after its anchor: changing it changes nothing.
    changed = projected.clone()
    changed[:, 3:] += torch.randn_like(changed[:, 3:])  # not a constant: LayerNorm would cancel it
    again = model.forward_blocks(x, block_positions, model.history_kv(changed, positions), cross, mask)
    torch.testing.assert_close(again[:, : k + 1], packed[:, : k + 1])
    assert not torch.allclose(again[:, k + 1 :], packed[:, k + 1 :])


def test_packed_windowed_blocks_equal_rounds_that_read_the_window(tiny_model):
    """Training's cross-attention mask reads what a round reads after ``observe_position``
    (the slice ``audio_window_span`` gives), with and without the attention weights the
    AnchorDraft loss needs."""
    from ct2_flash.drafting.audio_window import audio_window_span
    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.loop.options import DecodingOptions

    model, k = tiny_model, tiny_model.config.num_draft_tokens
    torch.manual_seed(2)
    frames, window = 600, (50, 150)
    encoder = torch.randn(1, frames, 16)
    history = torch.randn(1, 6, 16)
    drafter = FlashDrafter(model, precision="float32", min_confidence=0.0, audio_window=window)
    assert drafter.wants_position
    drafter.begin(DraftWindow(encoder[0].numpy(), (1, 2), DecodingOptions(), 49))
    drafter.advance(history[0].numpy(), 7)
    drafter.observe_position(237)
    start, stop = audio_window_span(237, frames, window)
    assert 0 < start < stop < frames
    proposal = drafter.propose([1, 2, 5], k)
    positions = torch.arange(1, 7)[None]
    history_kvs = model.history_kv(model.project_history(history), positions)
    x, block_positions = model.embed_blocks(torch.tensor([[5]]), torch.tensor([[7]]))
    cross_mask = torch.zeros(1, k + 1, frames, dtype=torch.bool)
    cross_mask[..., start:stop] = True
    for weights in (False, True):
        with torch.no_grad():
            out = model.forward_blocks(
                x, block_positions, history_kvs, model.cross_kv(encoder), None, cross_mask, cross_weights=weights
            )
        states = out[0] if weights else out
        logits = states[0, 1:] @ model.token_embedding[model.shortlist].T
        assert tuple(model.shortlist[logits.argmax(-1)].tolist()) == proposal.tokens
        if weights:
            attention = out[1][0]  # [k + 1, frames]: nothing outside the window, rows sum to 1
            assert float(attention[:, :start].abs().sum() + attention[:, stop:].abs().sum()) == 0.0
            torch.testing.assert_close(attention.sum(-1), torch.ones(k + 1))


def test_block_is_bidirectional(tiny_model):
    model = tiny_model
    k = model.config.num_draft_tokens
    cross = model.cross_kv(torch.randn(1, 7, 16))
    empty = [(torch.zeros(1, 0, 2, 8), torch.zeros(1, 0, 2, 8)) for _ in model.layers]
    x, positions = model.embed_blocks(torch.tensor([[3]]), torch.tensor([[4]]))
    base = model.forward_blocks(x, positions, empty, cross)
    changed = x.clone()
    changed[:, k] += torch.randn(16)  # the last mask token
    out = model.forward_blocks(changed, positions, empty, cross)
    assert not torch.allclose(out[:, 0], base[:, 0])  # the anchor sees the last mask


@pytest.fixture(scope="module")
def causal_model(tiny_model):
    """``tiny_model``'s weights with causal blocks."""
    model = FlashDrafterModel(dataclasses.replace(tiny_model.config, causal_blocks=True))
    model.load_state_dict(tiny_model.state_dict())
    return model.eval()


def test_causal_block_mask_lets_a_row_see_the_rows_before_it():
    k, history = 2, 6
    anchors, valid = torch.tensor([[2, 5]]), torch.tensor([6])
    mask = block_attention_mask(anchors, valid, history, k, causal=True)
    lower = [[True, False, False], [True, True, False], [True, True, True]]
    assert mask[0, : k + 1, history : history + k + 1].tolist() == lower
    assert mask[0, k + 1 :, history + k + 1 :].tolist() == lower
    assert not mask[0, : k + 1, history + k + 1 :].any() and not mask[0, k + 1 :, history : history + k + 1].any()
    torch.testing.assert_close(mask[..., :history], block_attention_mask(anchors, valid, history, k)[..., :history])


def test_causal_rounds_propose_what_training_packs_for_every_row_count(causal_model, tiny_model):
    """With causal blocks, training's packed pass (its mask) and a round of any k rows give
    the same tokens at the first k positions; a bidirectional drafter always computes K rows,
    so its short proposals are prefixes too."""
    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.loop.options import DecodingOptions

    k = causal_model.config.num_draft_tokens
    torch.manual_seed(3)
    encoder, history = torch.randn(1, 9, 16), torch.randn(1, 6, 16)
    positions = torch.arange(1, 7)[None]  # the prompt (1, 2) puts history index 0 at text position 1
    for model in (causal_model, tiny_model):
        history_kvs = model.history_kv(model.project_history(history), positions)
        x, block_positions = model.embed_blocks(torch.tensor([[5]]), torch.tensor([[7]]))
        mask = block_attention_mask(torch.tensor([[6]]), torch.tensor([6]), 6, k, model.config.causal_blocks)
        with torch.no_grad():
            packed = model.forward_blocks(x, block_positions, history_kvs, model.cross_kv(encoder), mask)
        expected = tuple(model.shortlist[model.logits(packed[0, 1:]).argmax(-1)].tolist())
        drafter = FlashDrafter(model, precision="float32", min_confidence=0.0)
        assert drafter.proposes_prefixes == model.config.causal_blocks
        drafter.begin(DraftWindow(encoder[0].numpy(), (1, 2), DecodingOptions(), 49))
        drafter.advance(history[0].numpy(), 7)
        for rows in range(1, k + 2):
            assert drafter.propose([1, 2, 5], rows).tokens == expected[:rows]
    # The anchor of a causal block does not see the masks after it.
    empty = [(torch.zeros(1, 0, 2, 8), torch.zeros(1, 0, 2, 8)) for _ in causal_model.layers]
    x, positions = causal_model.embed_blocks(torch.tensor([[3]]), torch.tensor([[4]]))
    cross = causal_model.cross_kv(encoder)
    mask = causal_model.proposal_mask(0, k + 1)
    changed = x.clone()
    changed[:, k] += torch.randn(16)
    with torch.no_grad():
        base = causal_model.forward_blocks(x, positions, empty, cross, mask)
        out = causal_model.forward_blocks(changed, positions, empty, cross, mask)
    torch.testing.assert_close(out[:, :k], base[:, :k])


def test_drafter_rounds_follow_the_model_and_cut_on_confidence(tiny_model):
    import numpy as np

    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.loop.options import DecodingOptions

    model, k = tiny_model, tiny_model.config.num_draft_tokens
    rng = np.random.default_rng(0)
    window = DraftWindow(rng.normal(size=(7, 16)).astype(np.float32), (1, 2), DecodingOptions(), eot=49)
    states = rng.normal(size=(4, 16)).astype(np.float32)  # positions 1..4: prompt end + 3 tokens
    with torch.no_grad():
        cached = model.history_kv(model.project_history(torch.from_numpy(states)[None]), torch.arange(1, 5)[None])
        x, positions = model.embed_blocks(torch.tensor([[7]]), torch.tensor([[5]]))
        expected = model.logits(
            model.forward_blocks(x, positions, cached, model.cross_kv(torch.from_numpy(window.encoder_output)[None]))
        )
    expected_tokens = tuple(expected[0, 1:].argmax(-1).tolist())
    proposals = {}
    for precision, confidence, keys in (
        ("float32", 0.0, None),
        ("bfloat16", 0.0, None),
        ("int8", 0.0, None),
        ("float32", 0.999, None),
        ("float32", 0.0, True),
    ):
        drafter = FlashDrafter(model, precision=precision, min_confidence=confidence, bfloat16_keys=keys)
        drafter.begin(window)
        drafter.advance(states[:1], 2)  # the controller's order: prefill state, then rounds
        drafter.advance(states[1:], 5)
        proposals[precision, confidence, keys] = drafter.propose([5, 6, 7], k).tokens
        bfloat16_keys = keys or precision == "bfloat16" or (precision == "int8" and bfloat16_is_fast())
        assert drafter._cross_kv[0][0].dtype == (torch.bfloat16 if bfloat16_keys else torch.float32)
    proposals = {key[:2]: tokens for key, tokens in proposals.items() if key[2] is None} | {
        "bf16 keys": proposals["float32", 0.0, True]
    }
    assert proposals["float32", 0.0] == expected_tokens
    # bfloat16 encoder keys change scores by ~1e-2 relative: same length, almost always the same tokens.
    assert (
        len(proposals["bf16 keys"]) == k
        and sum(a == b for a, b in zip(proposals["bf16 keys"], expected_tokens)) >= k - 2
    )
    for precision in ("bfloat16", "int8"):  # copies at other precisions; the model is untouched
        assert len(proposals[precision, 0.0]) == k and all(0 <= t < 50 for t in proposals[precision, 0.0])
    assert model.mask_embedding.dtype == torch.float32
    assert type(model.layers[0].qkv) is torch.nn.Linear
    # A random 50-token model is never 99.9% sure: the confident prefix is shorter.
    assert len(proposals["float32", 0.999]) < k
    assert proposals["float32", 0.999] == expected_tokens[: len(proposals["float32", 0.999])]


@pytest.mark.parametrize("switch", ["use_audio", "use_history"])
def test_ablations_remove_exactly_one_input(switch):
    import dataclasses

    torch.manual_seed(2)
    model = FlashDrafterModel(dataclasses.replace(tiny_config(), **{switch: False}))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
        model.token_embedding.normal_()
    history, encoder = torch.randn(1, 6, 16), torch.randn(1, 7, 16)
    positions = torch.arange(6)[None]
    x, block_positions = model.embed_blocks(torch.tensor([[3]]), torch.tensor([[6]]))

    def run(history, encoder):
        kv = model.history_kv(model.project_history(history), positions)
        return model.forward_blocks(x, block_positions, kv, model.cross_kv(encoder))

    base = run(history, encoder)
    new_audio, new_history = run(history, torch.randn(1, 7, 16)), run(torch.randn(1, 6, 16), encoder)
    assert torch.equal(base, new_audio) == (switch == "use_audio")
    assert torch.equal(base, new_history) == (switch == "use_history")
    assert FlashDrafter(model, precision="float32").needs_states == (switch == "use_audio")
    # Configs written before the switches existed load with both inputs on.
    old = model.config.to_json_dict()
    del old["use_audio"], old["use_history"]
    assert DrafterConfig.from_json_dict(old).use_audio and DrafterConfig.from_json_dict(old).use_history


@pytest.fixture(scope="module")
def real_drafter_dir(model_path, tmp_path_factory):
    config = DrafterConfig(target=target_identity(model_path, "tiny.en"))
    model = FlashDrafterModel(config)
    model.init_from_target(CT2ModelFile(model_path))
    directory = str(tmp_path_factory.mktemp("drafter"))
    save_checkpoint(model, directory)
    return directory, model


def test_checkpoint_round_trip(model_path, real_drafter_dir):
    directory, model = real_drafter_dir
    assert sorted(os.listdir(directory)) == ["drafter.json", "drafter.safetensors"]
    loaded = load_checkpoint(directory, model_path)
    assert loaded.config == model.config
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, msg=name)


def test_checkpoint_errors(model_path, real_drafter_dir, tmp_path):
    directory, model = real_drafter_dir
    with pytest.raises(CheckpointError, match="no drafter.json"):
        load_checkpoint(str(tmp_path), model_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "drafter.json").write_text(open(os.path.join(directory, "drafter.json")).read())
    (broken / "drafter.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(str(broken), model_path)
    other = json.loads(open(os.path.join(directory, "drafter.json")).read())
    other["target"]["vocab_size"] = 51865
    with pytest.raises(DrafterMismatchError, match="vocab_size: drafter 51865 vs model 51864"):
        check_target(DrafterConfig.from_json_dict(other), target_identity(model_path, "tiny.en"))
    # Loading checks the target before touching weights, so the error names the field.
    foreign = tmp_path / "foreign_vocab"
    foreign.mkdir()
    (foreign / "drafter.json").write_text(json.dumps(other))
    (foreign / "drafter.safetensors").write_bytes(open(os.path.join(directory, "drafter.safetensors"), "rb").read())
    with pytest.raises(DrafterMismatchError, match="vocab_size: drafter 51865 vs model 51864"):
        load_checkpoint(str(foreign), model_path)


def test_untrained_drafter_is_exact(float32_pair, clips, real_drafter_dir):
    _, model = real_drafter_dir
    flash = float32_pair.flash
    with flash.use_drafter(FlashDrafter(model, min_confidence=0.0)):
        flash.reset_spec_stats()
        for name in ("clip05_kal16.ogg", "clip10_awb.ogg"):
            expected = float32_pair.reference(name, clips[name], beam_size=1)
            assert segments_of(flash, clips[name], beam_size=1) == expected
    assert flash.spec_stats.proposed > 0


def test_model_loads_a_checkpoint_directory_and_refuses_a_foreign_one(model_path, real_drafter_dir, tmp_path):
    from ct2_flash import FlashWhisperModel

    directory, _ = real_drafter_dir
    flash = FlashWhisperModel(model_path, stock_engine=False, compute_type="int8", drafter=directory)
    assert isinstance(flash.drafter, FlashDrafter)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    config = json.loads(open(os.path.join(directory, "drafter.json")).read())
    config["target"]["tokenizer_sha256"] = "f" * 64
    (foreign / "drafter.json").write_text(json.dumps(config))
    (foreign / "drafter.safetensors").write_bytes(open(os.path.join(directory, "drafter.safetensors"), "rb").read())
    with pytest.raises(DrafterMismatchError, match="tokenizer_sha256"):
        FlashWhisperModel(model_path, stock_engine=False, compute_type="int8", drafter=str(foreign))
    with pytest.raises(TypeError, match="checkpoint directory"):
        FlashWhisperModel(model_path, stock_engine=False, compute_type="int8", drafter=42)
