"""bench_persistent's option sets (``--variants``): parsed into ``DecodeOptions`` keywords,
bad ones refused before any GPU work."""

import pytest

from benchmarks.bench_persistent import check_variants, parse_variant
from hexcore.cuda.attention.options import DecodeOptions


def test_default_is_no_options():
    assert parse_variant("default") == {}


def test_a_set_gives_the_options_it_names():
    kwargs = parse_variant("ctas_per_sm=8:eager_first=0:split_blocks=64")
    assert kwargs == {"ctas_per_sm": 8, "eager_first": False, "split_blocks": 64}
    options = DecodeOptions(**kwargs)
    assert (options.ctas_per_sm, options.eager_first, options.split_blocks) == (8, False, 64)
    assert parse_variant(" eager_first = 1 ") == {"eager_first": True}
    assert parse_variant("wide_one_launch=0") == {"wide_one_launch": False}
    assert DecodeOptions(**parse_variant("wide_one_launch=1")).wide_one_launch is True


@pytest.mark.parametrize("text, named", [
    ("ctas_per_sm", "'ctas_per_sm'"), ("ctas_per_sm=", "'ctas_per_sm='"), ("=8", "'=8'"),
    ("split_blocks=x", "'split_blocks=x'"), ("eager_first=2", "eager_first=2"),
    ("wide_one_launch=yes", "'wide_one_launch=yes'"), ("wide_one_launch=2", "wide_one_launch=2"),
    ("max_registers=168", "--registers"), ("persistent_item=1", "--items"),
])
def test_a_piece_it_cannot_read_exits_naming_it(text, named):
    with pytest.raises(SystemExit, match=named):
        parse_variant(text)


@pytest.mark.parametrize("variants, named", [
    (["default", "ctas=8"], "'ctas=8'"), (["ctas_per_sm=0"], "ctas_per_sm"),
])
def test_every_set_is_checked_up_front(variants, named):
    with pytest.raises(SystemExit, match=named):
        check_variants(variants)
    check_variants(["default", "ctas_per_sm=16:eager_first=1:split_blocks=128"])
