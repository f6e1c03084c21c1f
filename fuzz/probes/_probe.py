"""What the api_pass_N probes share: call an entry point with a hostile value, count it,
and keep every outcome that is neither a typed hexcore error nor a documented timeout."""

import warnings

from hexcore.errors import HexcoreError

warnings.simplefilter("ignore")
COUNT, LABELS, RAW = [0], [], []


def t(label: str, fn) -> None:
    """Call ``fn()``; a raw exception is recorded under ``label``."""
    COUNT[0] += 1
    LABELS.append(label)
    try:
        fn()
    except (HexcoreError, TimeoutError):
        pass
    except BaseException as e:  # noqa: BLE001 (what the probe is looking for)
        RAW.append(f"{label[:70]}: {type(e).__name__}: {str(e)[:120]}")


def refused_unchanged(label: str, fn, state, invariants, names: tuple = ()) -> None:
    """``fn()``; when it raises, ``state()`` must be what it was before (the parts that
    changed are recorded by ``names`` where given), and ``invariants()`` must hold either way."""
    before = state()
    try:
        fn()
    except Exception:
        after = state()
        if after != before:
            diff = [n for n, x, y in zip(names, before, after) if x != y] if names else ""
            RAW.append(f"{label[:70]}: state changed by a refused call {diff}".rstrip())
        raise
    finally:
        try:
            invariants()
        except Exception as e:  # noqa: BLE001
            RAW.append(f"{label[:70]}: invariants: {type(e).__name__}: {e}")


def report() -> None:
    """Print the raw outcomes, then the number of calls, raw outcomes and entry points."""
    print("\n".join(sorted(set(RAW))) if RAW else "none raw")
    print("calls", COUNT[0], "raw", len(RAW), "labels", len({label.split("(")[0] for label in LABELS}))
