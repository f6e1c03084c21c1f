"""bench_persistent's option sets (``--variants``): parsed into ``DecodeOptions`` keywords."""

import pytest

from benchmarks.bench_persistent import parse_variant
from hexcore.cuda.attention.options import DecodeOptions


def test_default_is_no_options():
    assert parse_variant("default") == {}


def test_a_set_gives_the_options_it_names():
    kwargs = parse_variant("ctas_per_sm=8:eager_first=0:split_blocks=64")
    assert kwargs == {"ctas_per_sm": 8, "eager_first": False, "split_blocks": 64}
    options = DecodeOptions(**kwargs)
    assert (options.ctas_per_sm, options.eager_first, options.split_blocks) == (8, False, 64)
    assert parse_variant("eager_first=1") == {"eager_first": True}


def test_an_unknown_field_is_refused_by_the_options():
    with pytest.raises(TypeError, match="ctas"):
        DecodeOptions(**parse_variant("ctas=8"))
