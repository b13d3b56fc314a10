"""Table-driven tests of greedy acceptance (vLLM's rejection-sampler test style)."""

import pytest

from ct2_flash.acceptance import greedy_accept

EOT = 50256


@pytest.mark.parametrize(
    "name, drafts, target_rows, accepted, next_token, rows_read",
    [
        ("perfect match, bonus", [5, 6, 7], [5, 6, 7, 8], 3, 8, 4),
        ("early mismatch", [5, 9, 7], [5, 6, 7, 8], 1, 6, 2),
        ("first token wrong", [9, 6, 7], [5, 6, 7, 8], 0, 5, 1),
        ("empty draft is a plain step", [], [5], 0, 5, 1),
        ("end-of-text accepted ends without bonus", [5, EOT, 7], [5, EOT, 1, 2], 2, None, 2),
        ("end-of-text as correction", [5, 6], [5, EOT, 3], 1, EOT, 2),
        ("end-of-text as bonus", [5, 6], [5, 6, EOT], 2, EOT, 3),
    ],
)
def test_greedy_accept(name, drafts, target_rows, accepted, next_token, rows_read):
    read = []

    def target_token(row):
        read.append(row)
        return target_rows[row]

    outcome = greedy_accept(drafts, target_token, EOT)
    assert (outcome.accepted, outcome.next_token) == (accepted, next_token), name
    # Rows are read in order and never past the first mismatch.
    assert read == list(range(rows_read)), name
    assert outcome.emitted == accepted + (next_token is not None)
