"""One decode shape at a time, for Nsight Compute:

    ncu --clock-control none -k regex:kernel --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 -m benchmarks.profile_decode int4 1     (dtype, index into bench_decode.SHAPES)

numba names every kernel's function ``kernel``; to pick one by its module, match the
demangled name: ``--kernel-name-base demangled -k regex:decode_kernel`` (or
``one_launch_kernel``, ...).

A format by age (``int2-aged``; or ``+merge``) runs its plan's launches as ``bench_decode`` times them.
``--variant NAME`` runs it with one of ``bench_decode``'s ``--variants`` options (e.g. ``--variant
"last pool merges"``).

``--lineinfo`` compiles every kernel with ``lineinfo=True`` (numba's line table; the code is
the same), for ncu's per-line sections: ``--section SourceCounters --import-source yes``,
then ``ncu -i REPORT --page source --csv --print-source sass``. ``python -m benchmarks.ncu_source``
splits such a page (with ``--section SourceCounters --section WarpStateStats``, line info or
not) into the kernel before its hot loop, the loop and after it.
"""

from __future__ import annotations

import sys

from numba import cuda


def with_lineinfo() -> None:
    """Make ``cuda.jit`` default to ``lineinfo=True`` for kernels (not device functions, nor
    with ``debug``, which numba does not combine with it); call before hexcore compiles."""
    jit = cuda.jit

    def jit_with_lineinfo(*args, **kwargs):
        if not kwargs.get("device") and not kwargs.get("debug"):
            kwargs.setdefault("lineinfo", True)
        return jit(*args, **kwargs)

    cuda.jit = jit_with_lineinfo


def main(argv: list[str]) -> None:
    if "--lineinfo" in argv:
        argv = [a for a in argv if a != "--lineinfo"]
        with_lineinfo()
    from benchmarks.bench_decode import SHAPES, case_for

    options, variant = None, ""
    if "--variant" in argv:
        at = argv.index("--variant")
        variant = argv[at + 1] if at + 1 < len(argv) else ""
        options = variant_options(variant)
        argv = argv[:at] + argv[at + 2:]
    dtype = argv[0] if argv else "fp16"
    shape = SHAPES[int(argv[1]) if len(argv) > 1 else 0]
    run, nbytes, _store, info = case_for(dtype)(dtype, *shape, options=options)
    for _ in range(3):
        run()
    cuda.synchronize()
    print(f"profiled {dtype}{' ' + variant if variant else ''} {shape} ({nbytes / 1e9:.3f} GB) {info}")


def variant_options(name: str):
    """The options of ``bench_decode``'s variant ``name`` (``--variant "last pool merges"``):
    a DecodeOptions, or a ``VerifySample`` for the ``verify ...`` ones (grid decode kernels
    only, not formats by age); an unknown name exits naming the known ones."""
    from benchmarks.bench_decode import option_variants

    variants = {key.strip(): options for key, options in option_variants().items() if key.strip()}
    if name not in variants:
        raise SystemExit(f"--variant: {name!r} is not one of {', '.join(sorted(variants))}")
    return variants[name]


if __name__ == "__main__":
    main(sys.argv[1:])
