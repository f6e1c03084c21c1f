"""The README's CPU-side API tour runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_block_manager_tour_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    tour = next(b for b in blocks if "PagedKVCache(" in b)
    namespace: dict = {}
    exec(compile(tour, "README.md", "exec"), namespace)
    cache = namespace["cache"]
    cache.check_invariants()
    assert cache.num_sequences == 2 and namespace["step"].ok
