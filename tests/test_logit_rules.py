"""LogitRules against CTranslate2's own edited logits (generate(return_logits_vocab=True)).

CTranslate2 returns, for every greedy step, the logits after its processors ran, with
disabled tokens set to the lowest float. Replaying the same tokens with single steps gives the
raw logits at float32 (bit for bit, or within 1e-5 after a batched prompt), so the set of disabled tokens must match exactly, for
timestamps on and off, a forced prefix, previous text and the suppression options.
"""

import numpy as np
import pytest

from ct2_flash.drafting import GreedyOptions

from .test_target import encode, prompts


@pytest.fixture(scope="module")
def windows(float32_pair, clips):
    return [encode(float32_pair.flash, clips[name]) for name in ("clip04_slt.ogg", "clip12_awb.ogg")]


CASES = [
    ("timestamps", {}),
    ("no timestamps", {}),
    ("previous text", {}),
    ("prefix", {}),
    ("timestamps", {"max_initial_timestamp_index": 0}),
    ("timestamps", {"suppress_blank": False, "suppress_tokens": []}),
    ("previous text, no timestamps", {"suppress_tokens": [-1, 13, 11]}),
]


@pytest.mark.parametrize("name, options", CASES)
def test_disabled_tokens_match_ctranslate2(float32_pair, windows, name, options):
    flash = float32_pair.flash
    decoder = flash.model.decoder
    prompt = prompts(flash)[name]
    greedy = GreedyOptions(
        suppress_tokens=tuple(options.get("suppress_tokens", (-1,))),
        **{k: v for k, v in options.items() if k != "suppress_tokens"},
    )
    rules = decoder.rules_for(prompt, greedy)
    checked = 0
    for window in windows:
        result = flash.model._model.generate(window, [prompt], beam_size=1, return_logits_vocab=True, **options)[0]
        tokens = list(result.sequences_ids[0])
        ct2_rows = [np.asarray(row) for row in result.logits[0]]
        prefix = rules.sample_begin
        prefill = decoder.runtime.start(window, prompt)
        raw = prefill.next_logits
        for step in range(prefix, len(ct2_rows)):
            edited = raw.copy()
            rules.apply(edited, tokens[:step])
            expected_disabled = ct2_rows[step] < -1e30
            np.testing.assert_array_equal(np.isneginf(edited), expected_disabled, err_msg=f"step {step}")
            enabled = ~expected_disabled
            # Bit-exact without previous text; a batched prompt pass moves values by ~1e-5.
            np.testing.assert_allclose(edited[enabled], ct2_rows[step][enabled], atol=1e-4)
            checked += 1
            if step < len(tokens):
                assert int(np.argmax(edited)) == tokens[step]
                raw = prefill.sequence.verify([tokens[step]])[0]
    assert checked > 20
