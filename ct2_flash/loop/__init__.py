"""The speculative decode loop on the patched runtime: propose, verify, accept, roll back, advance,
with exactly the tokens and scores of CTranslate2's ``generate()``.

- ``decoding``: the one loop (``SpeculativeDecoder``);
- ``target``: the frozen target: prefill, multi-token verify, rollback;
- ``logit_rules``: CTranslate2's suppression and timestamp rules, per row and per block;
- ``row_scores``: emitted tokens' scores in the engine's order of operations;
- ``drafts``: what a round verifies (``Draft``, ``DrawnDrafts``);
- ``acceptance``: the greedy and sampling rules (``GreedyRule``, ``SamplingRule``) and a round's
  ``RoundOutcome``;
- ``guard``: the margin guard: rows too close to call are decided by a single pass;
- ``draft_lengths``, ``draft_pause``: how many drafts a round asks for, and whether drafting
  pays in a window;
- ``options``: a call's decoding options as the loop reads them;
- ``vocabulary``: a model directory's vocabulary, special tokens and config;
- ``clock``: the one clock of the loop's time split;
- ``stats``: the loop's counters (``SpecStats``).
"""
