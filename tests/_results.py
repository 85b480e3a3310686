"""Comparing a run's test results with recorded ones (committed reports, the recorded smoke run)."""

import math

#: What names a test result, and its numbers.
LABELS = ("family", "name", "scenario", "position", "n")
NUMBERS = ("statistic", "pvalue")


def result_row(result) -> dict:
    """The labels and numbers of a :class:`~specverify.core.results.TestResult`, or of its JSON form."""
    get = result.get if isinstance(result, dict) else lambda key: getattr(result, key)
    return {key: get(key) for key in LABELS + NUMBERS}


def assert_same_statistics(recorded, again, *, rel_tol: float = 1e-9) -> None:
    """Test by test: equal labels and sample sizes; statistic and p-value within ``rel_tol`` relative (NaN equals NaN).

    The same code and seed give the same tokens, bins and orderings on every CPU
    (docs/reproducibility.md); the default 1e-9 only absorbs the last bits of float sums (in
    practice the table-model runs reproduce to the bit).  Runs through a float32 model forward
    use :data:`FORWARD_RTOL` (:func:`tolerance_for`), whose p-values also get an absolute 1e-12.
    """
    recorded, again = [result_row(r) for r in recorded], [result_row(r) for r in again]
    assert len(again) == len(recorded)
    abs_tol = {"statistic": 1e-300, "pvalue": 1e-12 if rel_tol > 1e-9 else 1e-300}
    for old, new in zip(recorded, again):
        where = f"{old['family']}/{old['name']} at {old['scenario']}/{old['position']}"
        assert [new[k] for k in LABELS] == [old[k] for k in LABELS], where
        for key in NUMBERS:
            a, b = float(old[key]), float(new[key])
            assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol[key]), (
                f"{where}: {key} {b!r} != recorded {a!r} (tolerance {rel_tol:g} relative)"
            )


#: How far a float32 model forward's laws move between CPU paths (relative, on tokens of positive
#: probability): the reference decoder's tiny transformer at T = 0.8, top-k 20 moved by at most
#: 3.7e-5 between the scalar and AVX-512 paths and 1.4e-5 between AVX2 and AVX-512, on 3,072
#: prefixes; the stated bound leaves a factor of about 2.7 (tests/test_portability.py checks it).
FORWARD_LAW_RTOL = 1e-4

#: Tolerance on statistics and p-values of a run whose exact law is a float32 model forward.  A
#: test statistic is a smooth function of the expected counts: for Cressie-Read,
#: dT/dE_i = 2/(l+1) (1 - (O_i/E_i)^(l+1)), so |dT| <= delta * 2/(l+1) * sum_i |E_i - O_i (O_i/E_i)^l|,
#: of order 2 delta sqrt(N * bins) against T of order bins; the committed decoder run (N <= 16,000,
#: >= 10 bins) moved by at most 2.4e-4 relative (6.4 delta) between paths.  1e-3 = 10 x
#: FORWARD_LAW_RTOL covers that with room; the tokens must be equal and the verdict too.
FORWARD_RTOL = 1e-3

#: Tolerance of a run whose laws are float64 tables or a float64 model forward: only last bits may
#: differ (measured: 1.1e-11 relative at most over 5,022 numbers of the table reports, AMD EPYC AVX2
#: against the AVX-512 recording).
TABLE_RTOL = 1e-9

#: The built-in reference decoder and target: a float64 forward unless ``dtype=float32`` is given.
_REFERENCE_FACTORIES = ("specverify.cli.factories:reference_decoder", "specverify.cli.factories:reference_target")


def tolerance_for(command: str) -> float:
    """The relative tolerance for a rerun of ``command``: float32 model forwards get :data:`FORWARD_RTOL`."""
    model_run = "--decoder" in command and "table_target" not in command and "ProtocolDecoder" not in command
    float64_reference = all(f in command for f in _REFERENCE_FACTORIES) and "dtype=float32" not in command
    return FORWARD_RTOL if model_run and not float64_reference else TABLE_RTOL
