"""Two pass-cost profiles for controller and cost-model tests: the two regimes a runtime falls in."""

from spekula.cost import CostModel


def memory_bound() -> CostModel:
    """A verify pass of 9 tokens costs about what 1 costs (a memory-bound kernel)."""
    return CostModel(target_s={n: 0.19 + 0.005 * (n - 1) for n in range(1, 10)}, draft_s_per_token=0.08, frozen=True)


def compute_bound() -> CostModel:
    """Every token of a pass costs most of a one-token pass (a compute-bound kernel, a cheap draft)."""
    target_s = {n: 0.032 * (0.75 * n + 0.25) for n in range(1, 10)}
    return CostModel(target_s=target_s, draft_s_per_token=0.023, frozen=True)


def llamacpp_avx512() -> CostModel:
    """llama.cpp's 1.5B Q4_K_M on 2 AVX-512 cores, measured (docs/BENCHMARKS.md, "Pass costs by width"):
    a 2-row pass 1.5x a one-row pass, 16 rows 4.4x, 17 rows dearer than 16 (4-row kernel groups)."""
    ms = {1: 33, 2: 50, 3: 62, 4: 75, 5: 93, 8: 131, 9: 141, 12: 155, 13: 162, 16: 146, 17: 177}
    return CostModel(target_s={n: v / 1000 for n, v in ms.items()}, frozen=True)


def llamacpp_issue14() -> CostModel:
    """llama.cpp's Q4 on 2 cores as issue 14 measured it: a 2-row pass 1.5x a one-row pass, 16 rows far cheaper
    than 17 (4-row kernel groups)."""
    ms = {1: 77, 2: 118, 4: 213, 8: 342, 9: 465, 12: 487, 13: 560, 16: 439, 17: 785}
    return CostModel(target_s={n: v / 1000 for n, v in ms.items()}, frozen=True)
