"""What a round verifies (``loop/drafts.py``): drafts drawn from the drafter's own distribution."""

import numpy as np

from ct2_flash.loop.options import DecodingOptions


def test_drafts_drawn_from_the_drafter_obey_the_targets_rules():
    """``draw_drafts`` (``drafts.DrawnDrafts.draw_from``): q at each position is the drafter's logits over its shortlist after the
    target's rules (given the drafts before it) and temperature; the drafts follow it."""
    from ct2_flash.drafting.base import Proposal
    from ct2_flash.loop.drafts import DrawnDrafts
    from ct2_flash.loop.logit_rules import LogitRules, SpecialTokens

    special = SpecialTokens(
        eot=50256, sot=50257, sot_prev=50360, no_speech=50361, no_timestamps=50362, vocab_size=51864
    )
    ts = special.timestamp_begin
    rules = LogitRules(
        special=special,
        suppress_ids=(11,),
        suppress_begin_ids=(),
        timestamps=True,
        max_initial_timestamp_id=ts + 50,
        sample_begin=0,
    )
    vocabulary = np.array([11, 262, 290, special.eot, ts, ts + 3, ts + 10], dtype=np.int64)
    # Every position prefers ts + 3 (logit 9) over text (5 for a suppressed token, 1 for others).
    logits = np.array([[5.0, 1.0, 1.0, 0.0, 0.0, 9.0, 0.0]] * 3, dtype=np.float32)
    sampling = DrawnDrafts(DecodingOptions(sampling_temperature=1.0, sampling_topk=0), draft_uniforms=np.full(10, 0.5))
    drafts, probs = sampling.draw_from(Proposal(tokens=(0, 0, 0), logits=logits, vocabulary=vocabulary), 3, rules, [])
    assert drafts[0] == ts + 3  # the first token must be a timestamp: text has no mass
    assert probs.shape == (len(drafts), 51864) and np.allclose(probs.sum(axis=1), 1.0)
    off = np.setdiff1d(np.arange(51864), vocabulary)
    assert probs[:, off].max() == 0 and probs[:, 11].max() == 0  # off the shortlist, suppressed
    assert probs[0, :ts].max() == 0
    # The first timestamp counts as a pair: text follows, and after it no timestamp <= ts + 3.
    assert probs[1, ts:].max() == 0 and drafts[1] in (262, 290, special.eot)
    if drafts[1] != special.eot:
        assert probs[2, ts : ts + 4].max() == 0 and probs[2, ts + 10] > 0
