"""HexcoreCache.adopt: rows filled outside transformers (``Engine.prefill``), continued by
the model's decode forwards. Random-weight models as in ``test_transformers`` (the CUDA
simulator with a float32 model on the CPU, or a GPU in float16); skipped without torch and
transformers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hexcore import HexcoreInvalidArgumentError, HexcoreInvalidSequenceError  # noqa: E402
from tests.integrations.test_transformers import (  # noqa: E402
    DEVICE, generate, make_cache, ragged_prompts, relative_error, rows_with_blocks, tiny_model)


# -- refusals: checked before anything changes ----------------------------------------------
@pytest.mark.parametrize("ids,error,match", [
    (lambda live: [live[0], live[0]], HexcoreInvalidArgumentError, r"seq_ids\[1\]: sequence \d+ is listed twice"),
    (lambda live: [live[0], 7], HexcoreInvalidSequenceError, r"seq_ids\[1\]: 7 is not a live sequence"),
    (lambda live: [live[0], live[2]], HexcoreInvalidArgumentError,
     r"seq_ids\[1\]: sequence \d+ holds 33 tokens, seq_ids\[0\] holds 20"),
    (lambda live: [], HexcoreInvalidArgumentError, "seq_ids: expected at least one sequence"),
    (lambda live: [live[3]], HexcoreInvalidArgumentError, "seq_ids: the sequences hold no tokens"),
    (lambda live: [1.0], HexcoreInvalidArgumentError, r"seq_ids\[0\]: expected an int"),
    (lambda live: 3, HexcoreInvalidArgumentError, "seq_ids: expected a 1-D sequence of ints"),
    (lambda live: torch.tensor(live[0]), HexcoreInvalidArgumentError, "seq_ids: expected a 1-D sequence of ints"),
], ids=["duplicate", "not-live", "unequal-lengths", "empty", "no-tokens", "float-id", "scalar", "0-d-tensor"])
def test_adopt_refuses_bad_input_and_keeps_the_rows(seed, ids, error, match):
    cache = make_cache(tiny_model(seed))
    live = [cache.engine.add() for _ in range(2)]  # 20 tokens each, 33, and an empty one
    for seq in live:
        cache.engine.cache.grow_sequence(seq, 20)
    live += [cache.engine.add(), cache.engine.add()]
    cache.engine.cache.grow_sequence(live[2], 33)
    rows = rows_with_blocks(cache, [40])
    cache._length = 40
    with pytest.raises(error, match=match):
        cache.adopt(ids(live))
    assert cache.rows == rows and cache.get_seq_length() == 40
    assert all(cache.engine.cache.is_live(seq) for seq in live + rows)


def test_adopt_frees_the_rows_it_replaces_and_keeps_those_it_adopts(seed):
    cache = make_cache(tiny_model(seed))
    old, kept = rows_with_blocks(cache, [40, 20])
    new = cache.engine.add()
    cache.engine.cache.grow_sequence(new, 20)
    cache.adopt([new, kept])
    assert cache.rows == [new, kept] and cache.get_seq_length() == 20 and cache._journals == [None, None]
    assert not cache.engine.cache.is_live(old) and cache.engine.cache.num_sequences == 2
    cache.engine.cache.check_invariants()


def test_adopt_is_refused_in_the_middle_of_a_forward(seed):
    cache = make_cache(tiny_model(seed))
    seq = cache.engine.add()
    cache.engine.cache.grow_sequence(seq, 20)
    cache._prefill = object()  # a prompt being staged
    with pytest.raises(HexcoreInvalidArgumentError, match="adopt: cannot adopt rows in the middle of a forward"):
        cache.adopt([seq])
    assert cache.rows == []


# -- end to end, small enough for the simulator ---------------------------------------------
def prompt_kv(model, ids):
    """The prompt's K/V per row as Engine.prefill takes them: float16 ``[L, T, H, D]`` each,
    from a DynamicCache forward over ``ids`` ``[B, T]``; and that cache."""
    dynamic = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, past_key_values=dynamic, use_cache=True)
    keys = torch.stack([layer.keys for layer in dynamic.layers])  # [L, B, H, T, D]
    values = torch.stack([layer.values for layer in dynamic.layers])

    def row(x, b):
        x = x[:, b].transpose(1, 2).to(torch.float16).contiguous()
        return x if x.is_cuda else x.numpy()

    return [(row(keys, b), row(values, b)) for b in range(ids.shape[0])], dynamic


def decode(model, cache, tokens, start):
    """Logits ``[steps, B, vocab]`` of decode forwards feeding ``tokens`` ``[B, steps]`` at positions ``start``, ..."""
    out = []
    with torch.no_grad():
        for t in range(tokens.shape[1]):
            positions = torch.full((tokens.shape[0], 1), start + t, dtype=torch.long, device=tokens.device)
            out.append(model(tokens[:, t:t + 1], past_key_values=cache, position_ids=positions,
                             use_cache=True).logits[:, -1])
    return torch.stack(out)


def test_adopted_rows_decode_as_rows_prefilled_by_generate(seed):
    # 2 rows of 31 tokens (a sealed block of 16 and 15 in the tail): the first decode step seals;
    # one KV head (the simulator's decode takes seconds per row and head)
    model = tiny_model(seed, q_heads=2, kv_heads=1)
    ids, mask = ragged_prompts(seed, [31, 31])
    prefilled = make_cache(model)
    generate(model, prefilled, ids, mask, 1)  # one new token: only the prompt ran through the model
    kv, dynamic = prompt_kv(model, ids)
    adopted = make_cache(model)
    seqs = [adopted.engine.add() for _ in kv]
    for seq, (k, v) in zip(seqs, kv):
        adopted.engine.prefill(seq, k, v)
    adopted.adopt(seqs)
    assert adopted.get_seq_length() == prefilled.get_seq_length() == 31
    tokens = torch.randint(3, 96, (2, 2), generator=torch.Generator().manual_seed(seed % 2**31)).to(DEVICE)
    want, got = decode(model, prefilled, tokens, 31), decode(model, adopted, tokens, 31)
    ref = decode(model, dynamic, tokens, 31)
    for step in range(tokens.shape[1]):
        assert relative_error(got[step], want[step]) <= 1e-6, step  # the same store, the same kernels
        assert relative_error(got[step], ref[step]) <= 5e-3, step  # float16 K/V against DynamicCache's
    assert [adopted.engine.seq_len(s) for s in adopted.rows] == [33, 33]
    adopted.engine.cache.check_invariants()
