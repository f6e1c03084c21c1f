"""Coverage-guided fuzzing of one hexcore target with atheris (libFuzzer).

    python fuzz/fuzz.py TARGET [libFuzzer flags] [CORPUS_DIR ...]

TARGET is one of ``fuzz/harness.py``'s TARGETS (block_manager, ring_attach, config,
cli, launchers, persistent). The pure-Python modules a target runs through are instrumented for
coverage; njit modules are not (atheris rewrites bytecode, numba compiles bytecode:
the two do not mix, and the njit code is native anyway). A failing input is written
by libFuzzer as ``crash-<sha1>``; replay it with
``python fuzz/fuzz.py TARGET crash-<sha1>``. See fuzz/README.md.
"""

from __future__ import annotations

import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# The modules each target drives; everything of hexcore they import is instrumented
# except the modules holding njit (or CUDA device) code.
IMPORTS = {
    "block_manager": ["hexcore.host.allocator", "hexcore.host.events", "hexcore.host.metrics"],
    "ring_attach": ["hexcore.host.ring"],
    "config": ["hexcore.config"],
    "cli": ["hexcore.cli"],
    "launchers": ["hexcore.cuda"],
    "persistent": ["hexcore.cuda"],
}
SIMULATED = ("launchers", "persistent")  # targets that run kernels on numba's CUDA simulator
NOT_INSTRUMENTED = ["hexcore.host._atomics", "hexcore.host._blocks", "hexcore.host._event_ops", "hexcore.host._keys",
                    "hexcore.host._prefix", "hexcore.host._ring_ops", "hexcore.host._step", "hexcore.host.prefix",
                    "hexcore.host.speculative", "hexcore.layout", "hexcore.cuda.device", "hexcore.cuda.device_layout",
                    "hexcore.cuda.mma", "hexcore.cuda.attention.kernel",
                    "hexcore.cuda.attention.fragments", "hexcore.cuda.steps.indices"]


def main() -> None:
    import atheris

    if len(sys.argv) < 2 or sys.argv[1] not in IMPORTS:
        sys.exit(f"usage: python fuzz/fuzz.py {{{','.join(IMPORTS)}}} [libFuzzer flags] [corpus dirs]")
    target = sys.argv.pop(1)
    if target in SIMULATED:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    # the harness too: its model's branches (an eviction, a prefix hit, a pin) are
    # coverage, so inputs that reach them are kept even where the njit core is invisible
    with atheris.instrument_imports(include=["hexcore", "fuzz.harness"], exclude=NOT_INSTRUMENTED):
        for name in IMPORTS[target]:
            __import__(name)
        from fuzz.harness import TARGETS
    if target in SIMULATED:
        from hexcore.cuda.simulated import use_fast_simulator

        use_fast_simulator()  # the same results, several times faster (patches the simulator's classes)

    # libFuzzer re-runs argv[0] through the shell for -merge=1 and -fork: make it a
    # command line that names the interpreter and the target
    sys.argv[0] = " ".join(shlex.quote(a) for a in (sys.executable, os.path.abspath(__file__), target))
    atheris.Setup(sys.argv, TARGETS[target])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
