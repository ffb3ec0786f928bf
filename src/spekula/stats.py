"""Statistical tests shared by the test suite and `spekula audit`."""

from __future__ import annotations

import numpy as np

from spekula.extras import needs_extra


def chi_square_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """Pearson's goodness-of-fit p-value of observed `counts` against exact `probs` (same length).

    Cells whose expected count is below `min_expected` are pooled into one cell, so the chi-square
    approximation holds. Raises AssertionError if a cell with probability 0 was observed, since
    no test statistic is needed to reject that.
    """
    with needs_extra("bench", "the chi-square test"):
        from scipy.stats import chisquare

    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    impossible = probs <= 0
    if counts[impossible].sum() > 0:
        raise AssertionError(f"observed {int(counts[impossible].sum())} samples of tokens with probability 0")
    counts, probs = counts[~impossible], probs[~impossible] / probs[~impossible].sum()
    expected = probs * counts.sum()
    small = expected < min_expected
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    if len(counts) < 2:
        return 1.0
    return float(chisquare(counts, expected).pvalue)
