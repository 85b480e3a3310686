"""Comparing a run's test results with recorded ones (committed reports, the recorded smoke run)."""

import math

#: What names a test result, and its numbers.
LABELS = ("family", "name", "scenario", "position", "n")
NUMBERS = ("statistic", "pvalue")


def result_row(result) -> dict:
    """The labels and numbers of a :class:`~specverify.core.results.TestResult`, or of its JSON form."""
    get = result.get if isinstance(result, dict) else lambda key: getattr(result, key)
    return {key: get(key) for key in LABELS + NUMBERS}


def assert_same_statistics(recorded, again) -> None:
    """Test by test: equal labels and sample sizes; statistic and p-value within 1e-9 relative (NaN equals NaN).

    The same code and seed give the same tokens; the tolerance only absorbs the last bits of the
    statistics' float sums, which depend on how the CPU vectorises them.
    """
    recorded, again = [result_row(r) for r in recorded], [result_row(r) for r in again]
    assert len(again) == len(recorded)
    for old, new in zip(recorded, again):
        where = f"{old['family']}/{old['name']} at {old['scenario']}/{old['position']}"
        assert [new[k] for k in LABELS] == [old[k] for k in LABELS], where
        for key in NUMBERS:
            a, b = float(old[key]), float(new[key])
            assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300), (
                f"{where}: {key} {b!r} != recorded {a!r}"
            )
