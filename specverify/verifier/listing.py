"""The scenarios a battery runs, named without running anything: ``specverify.list_scenarios``."""

from __future__ import annotations

from specverify.core.errors import InvalidArgument

__all__ = ["KINDS", "list_scenarios"]

KINDS = ("verifier", "tree_verifier")


def list_scenarios(kind: str = "verifier", *, tier: str = "smoke", greedy: bool = False, verify_tree=None) -> list[str]:
    """Names of the scenarios a battery runs (without running anything).

    Parameters
    ----------
    kind : {"verifier", "tree_verifier"}
        ``"verifier"``: :func:`check_verifier` (``greedy=True``: its greedy battery);
        ``"tree_verifier"``: :func:`check_tree_verifier`.  The decoder battery and the drafter
        audit have no named scenarios (they test the prompts and positions of their plan).
    tier : str
        Validated only: every tier runs the same scenarios (tiers scale the number of batches).
    greedy : bool
        The greedy chain battery (``kind="verifier"`` only).
    verify_tree : callable, optional
        The tree verifier to be audited: the scenarios it would run.  The edge-coin scenario
        needs a uniforms-in kernel (``verify_tree.kernel``), so a plain tree verifier runs one
        scenario fewer than the list without ``verify_tree``.

    Raises
    ------
    InvalidArgument
        An unknown kind or tier, ``greedy`` for trees, ``verify_tree`` for chains.
    """
    if kind not in KINDS:
        hint = f" (the tier is a keyword: tier={kind!r})" if kind in ("smoke", "standard", "deep") else ""
        raise InvalidArgument(f"kind must be one of {KINDS}, got {kind!r}{hint}")
    if kind == "verifier":
        from specverify.verifier import battery

        if verify_tree is not None:
            raise InvalidArgument("verify_tree applies to kind='tree_verifier'")
        return battery.list_scenarios(tier, greedy=greedy)
    from specverify.verifier.tree import battery as tree_battery
    from specverify.verifier.tree.scenarios import get_tree_scenarios

    names = tree_battery.list_scenarios(tier, greedy=greedy)
    if verify_tree is None:
        return names
    skipped = {s.name for s in get_tree_scenarios() if tree_battery._skipped(verify_tree, s)}
    return [n for n in names if n not in skipped]
