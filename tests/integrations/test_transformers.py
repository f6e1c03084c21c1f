"""HexcoreCache and the "hexcore" attention in transformers' generate(), against DynamicCache.

Random-weight models built from configs (no downloads). Without torch and transformers
(CI) the module is skipped. The ``gpu`` tests run on a real GPU in float16; the others
run on whatever is there (the CUDA simulator with a float32 model on the CPU, or a GPU).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hexcore import HexcoreConfigError, HexcoreInvalidArgumentError  # noqa: E402
from hexcore.integrations import transformers as hx  # noqa: E402
from tests.conftest import real_gpu_available  # noqa: E402

GPU = real_gpu_available()
DEVICE = "cuda" if GPU else "cpu"


def tiny_config(arch="llama", layers=2, q_heads=4, kv_heads=2, head_dim=64, vocab=96, **extra):
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "mistral": transformers.MistralConfig}[arch]
    fields = dict(hidden_size=q_heads * head_dim, intermediate_size=2 * q_heads * head_dim, num_hidden_layers=layers,
                  num_attention_heads=q_heads, num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
                  max_position_embeddings=1024, initializer_range=0.1, pad_token_id=0, eos_token_id=1,
                  bos_token_id=2)
    if arch == "mistral":
        fields["sliding_window"] = None
    fields.update(extra)
    return cls(**fields)


def tiny_model(seed, dtype=None, **config):
    torch.manual_seed(seed % 2**31)
    dtype = dtype or (torch.float16 if GPU else torch.float32)
    cfg = tiny_config(**config)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="hexcore", dtype=dtype)
    return model.to(DEVICE).eval()


def make_cache(model, kv_dtype="fp16", **kwargs):
    """A HexcoreCache of ``model`` (built from the model itself with ``prefix_cache=True``)."""
    kwargs = {"max_tokens": 1024, "max_seqs": 8, "block_size": 16, **kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the simulator's eager decode graphs
        return hx.HexcoreCache(model if kwargs.get("prefix_cache") else model.config, kv_dtype=kv_dtype, **kwargs)


def ragged_prompts(seed, lengths, vocab=96):
    """Left-padded ids and attention mask for prompts of ``lengths`` tokens."""
    gen = torch.Generator().manual_seed(seed % 2**31)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(3, vocab, (n,), generator=gen)
        mask[row, width - n:] = 1
    return ids.to(DEVICE), mask.to(DEVICE)


def generate(model, cache, ids, mask, new_tokens, **kwargs):
    """Greedy generate() of ``new_tokens`` (end-of-sequence suppressed unless ``min_new_tokens`` is given).
    ``mask`` None means no padding: an explicit mask of ones, since generate() would otherwise mask every
    padding id (0) in ``ids``, and a random model generates 0 as readily as any token."""
    kwargs = {"min_new_tokens": new_tokens, **kwargs}
    mask = torch.ones_like(ids) if mask is None else mask
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=new_tokens,
                              do_sample=False, output_logits=True, output_scores=True, return_dict_in_generate=True,
                              pad_token_id=0,
                              **kwargs)


def same_greedy_path(got, ref, margin: float = 1e-2, until: int | None = None) -> int:
    """Greedy generations must be token-identical, except that they may part at a near-tie
    (random-weight models have many): at the first step where the tokens differ, the
    reference's two best scores of each differing row must lie within ``margin`` of the
    step's largest logit. Scores, not logits: greedy search picks from the processed scores,
    where ``min_new_tokens`` masks the end-of-sequence token (often the largest logit of a
    random model). From step ``until`` on (None: never) the paths may part freely. Returns
    the first step where they differ (the number of new tokens when none does)."""
    steps = len(ref.logits)
    differ = (got.sequences[:, -steps:] != ref.sequences[:, -steps:])
    parted = differ.any(dim=0).nonzero()
    first = int(parted[0]) if len(parted) else steps
    if first < min(steps, steps if until is None else until):
        logits, scores = ref.logits[first].float(), ref.scores[first].float()
        rows = differ[:, first]
        best2 = scores[rows].topk(2, dim=-1).values
        gap = float((best2[:, 0] - best2[:, 1]).max())
        assert gap <= margin * float(logits.abs().max()), f"tokens part at step {first} with a top-2 gap of {gap}"
    print(f"greedy paths identical for {first} of {steps} new tokens")
    return first


def worst_logits_error(got, ref) -> float:
    """The largest relative error of ``got``'s logits against ``ref``'s over the steps where
    both still follow the same greedy path (``same_greedy_path``), the first divergent one
    included."""
    same = same_greedy_path(got, ref)
    return max(relative_error(a, b) for a, b in zip(got.logits[:same + 1], ref.logits[:same + 1]))


def relative_error(got, ref) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


class BeamRecorder(transformers.LogitsProcessor):
    """A logits processor that changes nothing and keeps the beams of every step of a
    beam search (``input_ids`` ``[B * num_beams, prompt + step]``): pass a fresh one to each
    generate() as ``logits_processor=LogitsProcessorList([recorder])`` (after generate()'s
    own processors, so the scores it sees are the ones ``output_scores`` reports)."""

    def __init__(self, num_beams: int):
        self.num_beams, self.beams = num_beams, []

    def __call__(self, input_ids, scores):
        self.beams.append(input_ids.to("cpu", copy=True))
        return scores


def beam_search(model, ids, cache, num_beams: int = 4, num_return_sequences: int = 2, new_tokens: int = 32,
                mask=None):
    """Beam search of ``new_tokens`` (end-of-sequence suppressed) on ``cache``: (generate()'s
    output, a BeamRecorder of it). ``mask`` None means no padding (an explicit mask of ones:
    without one, generate() hides every padding id 0 in ``ids``, which a random model's turn-1
    answer may hold, and the uncached forward of check (1) would not)."""
    recorder = BeamRecorder(num_beams)
    mask = torch.ones_like(ids) if mask is None else mask
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, num_beams=num_beams,
                             num_return_sequences=num_return_sequences, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True,
                             logits_processor=transformers.LogitsProcessorList([recorder]))
    return out, recorder


# How far below DynamicCache's cut a candidate hexcore kept may score (a running sum of
# log-probabilities): two correct float16 caches (DynamicCache with SDPA against eager
# attention, or against its prefix K/V times 1 + 2^-11 noise) parted the beams of 45 of 60
# runs (30 seeds, CPU), at most 0.036 below the cut; the H200's float16 kernels may differ
# more, hence 0.1. A DynamicCache whose reorder does nothing parted them 0.0096-7.1 below
# (median 0.8); check (1) fails it every time (relative error 0.66-0.81 against 0.002-0.003).
BEAM_TIE_MARGIN = 0.1


def check_beam_search(model, got, ref, mask, rtol: float = 2e-2, margin: float = BEAM_TIE_MARGIN):
    """Beam search over hexcore (``got``) against DynamicCache (``ref``): each a pair
    (generate()'s output with ``output_scores=True, return_dict_in_generate=True``, its
    BeamRecorder), as ``beam_search`` gives them. Random-weight models have many near-ties
    among the candidates, and two correct caches part there (on the CPU in float16,
    DynamicCache with SDPA against DynamicCache with eager attention parts every returned
    beam for 6 of 30 seeds), so identity is not asked for; instead:

    (1) the log-probabilities generate() reported for each token of each returned beam are
        the model's own for that exact sequence, run whole without any cache (a wrong fork,
        reorder or block would break this whatever path the beams took), as closely as
        DynamicCache's reported ones are;
    (2) the beams of every step are DynamicCache's up to the first step where they part,
        and they part only at a near-tie (``same_beam_path``): a candidate hexcore kept and
        DynamicCache did not scored, by DynamicCache's own running scores, within ``margin``
        of the lowest one DynamicCache kept. From there on the beams may part freely;
    (3) each returned beam identical to the reference's has its score.
    """
    (got, got_beams), (ref, ref_beams) = got, ref
    got_error, where = _reported_vs_uncached(model, got, mask)
    ref_error, _ = _reported_vs_uncached(model, ref, mask)
    assert got_error <= ref_error + rtol, (f"reported vs uncached log-probabilities: rel. error {got_error:.2e} "
                                           f"(DynamicCache's {ref_error:.2e}); {where}")
    first, gap = same_beam_path(got, got_beams, ref, ref_beams, margin)
    same = (got.sequences == ref.sequences).all(dim=1)
    assert torch.allclose(got.sequences_scores.float()[same], ref.sequences_scores.float()[same], rtol=rtol)
    print(f"beams identical to DynamicCache's for {first} of {len(ref.scores)} steps"
          + ("" if gap is None else f", then parted at a near-tie ({gap:.2e} below the cut)")
          + f"; returned beams identical: {int(same.sum())} of {same.numel()}; log-probs vs uncached "
          f"{got_error:.2e} (DynamicCache's {ref_error:.2e})")


def same_beam_path(got, got_beams, ref, ref_beams, margin: float = BEAM_TIE_MARGIN) -> tuple:
    """The first step where hexcore's beams (``got``, ``got_beams``: generate()'s output and
    its BeamRecorder) differ from DynamicCache's (``ref``, ``ref_beams``) as a set, per
    prompt, and by how much DynamicCache's running score of the worst candidate hexcore
    kept instead lies below the lowest DynamicCache kept (None when nothing parted).
    Asserts that gap is at most ``margin``. Step ``steps`` (the number of new tokens) is
    the choice of the returned beams among the last step's candidates. DynamicCache's
    running scores are rebuilt from its reported per-step scores along its beams' paths."""
    steps, total, returned = len(ref.scores), ref_beams.beams[0].shape[0], ref.sequences.shape[0]
    num_beams = ref_beams.num_beams
    worst_first, worst_gap = steps + 1, None
    for p in range(total // num_beams):
        rows = slice(p * num_beams, (p + 1) * num_beams)
        per = returned * num_beams // total
        running = {tuple(r): 0.0 for r in ref_beams.beams[0][rows].tolist()}  # step 0: copies of the prompt
        for step in range(steps + 1):
            last = step == steps
            if last:
                want = {tuple(r) for r in ref.sequences[p * per:(p + 1) * per].tolist()}
                have = {tuple(r) for r in got.sequences[p * per:(p + 1) * per].tolist()}
            else:
                want = {tuple(r) for r in ref_beams.beams[step][rows].tolist()}
                have = {tuple(r) for r in got_beams.beams[step][rows].tolist()}
            if want != have:
                cut = min(running[r] for r in want)
                lost = [running.get(r, float("-inf")) for r in have - want]
                gap = cut - min(lost)
                assert gap <= margin, (f"prompt {p}: beams part from DynamicCache's at step {step} of {steps} with a "
                                       f"candidate {gap:.3g} below DynamicCache's lowest kept one (margin {margin})")
                if step < worst_first:
                    worst_first, worst_gap = step, gap
                break
            if last:
                break
            scores = ref.scores[step][rows].float().cpu().tolist()
            rows_now = ref_beams.beams[step][rows].tolist()
            running = {tuple(r) + (v,): running[tuple(r)] + x for r, row_scores in zip(rows_now, scores)
                       for v, x in enumerate(row_scores) if math.isfinite(x)}
    return min(worst_first, steps), worst_gap


def _reported_vs_uncached(model, out, mask) -> tuple[float, str]:
    """(relative error of the log-probabilities generate() reported for ``out``'s beams
    against an uncached forward of the same sequences, where the worst one is)."""
    new = len(out.scores)
    reported = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    prompt_mask = mask.repeat_interleave(out.sequences.shape[0] // mask.shape[0], dim=0)
    full_mask = torch.cat([prompt_mask, torch.ones_like(out.sequences[:, -new:])], dim=1)
    with torch.no_grad():
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers a left-padded row
        logits = model(out.sequences, attention_mask=full_mask, position_ids=positions, use_cache=False).logits
    logits = logits[:, -new - 1:-1]
    uncached = logits.float().log_softmax(-1).gather(-1, out.sequences[:, -new:, None])[..., 0]
    worst = (reported.float() - uncached).abs()
    row, step = divmod(int(worst.argmax()), worst.shape[1])
    where = (f"worst at beam {row}, new token {step} ({float(reported[row, step]):.3f} vs "
             f"{float(uncached[row, step]):.3f})")
    return relative_error(reported, uncached), where


# -- end to end, small enough for the simulator ---------------------------------------------
def test_ragged_batch_fp16_matches_dynamic_cache(seed):
    # rows of 15 and 9 tokens: the first seals a block in the first decode step
    model = tiny_model(seed)
    ids, mask = ragged_prompts(seed, [15, 9])
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 3)
    cache = make_cache(model)
    got = generate(model, cache, ids, mask, 3)
    assert torch.equal(got.sequences, ref.sequences)
    for step, (a, b) in enumerate(zip(got.logits, ref.logits)):
        assert relative_error(a, b) <= 5e-3, step
    assert cache.get_seq_length() == 15 + 3 - 1  # the last token is not run through the model
    assert [cache.engine.seq_len(s) for s in cache.rows] == [15 + 2, 9 + 2]
    cache.reset()
    assert cache.engine.cache.num_free_blocks == cache.engine.store.num_blocks
    cache.engine.cache.check_invariants()


@pytest.mark.parametrize("fmt,quantized,bound", [("int4-aged", False, 5e-3), ("int2-aged", True, 0.5)])
def test_a_format_by_age_generates(fmt, quantized, bound, seed):
    # rows of 40 and 20 tokens, block 16: the first's block 0 is the FP16 sink, its block 1
    # is sealed INT4 at age 0 under int2-aged (FP16 under int4-aged: younger than 32 tokens).
    # All FP16: as DynamicCache. One INT4 block moves a random-weight model's logits by
    # 0.06-0.19 (seeds 7767392829664459335 and the next run's): a loose bound that tells a
    # read block from none; the Engine's and the kernels' tests check the values exactly
    model = tiny_model(seed)
    ids, mask = ragged_prompts(seed, [40, 20])
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 4)
    cache = make_cache(model, kv_dtype=fmt)
    assert cache.engine.cache.format.name == fmt and len(cache.engine.stores) == 2 + quantized
    got = generate(model, cache, ids, mask, 4)
    errors = [relative_error(a, b) for a, b in zip(got.logits, ref.logits)]
    print(f"{fmt}: logits vs DynamicCache, relative error per step {[f'{e:.1e}' for e in errors]}")
    if quantized:  # the INT4 block is read; the paths may part where its error can reach (seed
        # 2685101426554246840 parts at step 2 at a top-2 gap of 0.30, 7% of the largest logit)
        assert 1e-4 < max(errors[:same_greedy_path(got, ref, margin=bound) + 1]) <= bound
    else:
        assert torch.equal(got.sequences, ref.sequences) and max(errors) <= bound
    pools = cache.engine.cache.pools
    assert [p.num_blocks for p in pools][-1] == 1024 // 16  # the last tier's pool holds max_tokens
    with pytest.raises(HexcoreConfigError, match=f"crop: not with a format by age \\({fmt}\\)"):
        cache.crop(-1)
    cache.reset()
    assert all(p.num_free_blocks == p.num_blocks for p in pools)


def test_check_beam_search_passes_beams_parted_at_a_near_tie_and_fails_a_broken_reorder():
    # the check itself, on two correct caches that part: DynamicCache with eager attention
    # against SDPA, in float16 (on the CPU, seed 25's beams part at step 3, 0.019 below the
    # cut, and every returned beam differs: what failed the old "at least half identical"
    # rule); and on a DynamicCache whose reorder_cache does nothing (the beams attend to
    # another beam's K/V)
    model = tiny_model(25, dtype=torch.float16, **ARCHS[0])
    ids, _ = ragged_prompts(25, [88])
    ref = beam_search(model, ids, transformers.DynamicCache(config=model.config))
    model.config._attn_implementation = "eager"
    got = beam_search(model, ids, transformers.DynamicCache(config=model.config))
    model.config._attn_implementation = "sdpa"
    check_beam_search(model, got, ref, torch.ones_like(ids))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.DynamicCache, "reorder_cache", lambda self, beam_idx: None)
        broken = beam_search(model, ids, transformers.DynamicCache(config=model.config))
    with pytest.raises(AssertionError, match="reported vs uncached"):
        check_beam_search(model, broken, ref, torch.ones_like(ids))


def test_beam_search_on_a_format_by_age(seed):
    # forks of the format's rows (sealed blocks in two pools shared, tails copied) under
    # beam search; int4-aged holds these short rows in FP16, so DynamicCache is the reference
    model = tiny_model(seed)
    ids, mask = ragged_prompts(seed, [20, 13])
    kwargs = dict(num_beams=2, num_return_sequences=2, new_tokens=4, mask=mask)
    ref = beam_search(model, ids, transformers.DynamicCache(config=model.config), **kwargs)
    cache = make_cache(model, kv_dtype="int4-aged")
    got = beam_search(model, ids, cache, **kwargs)
    check_beam_search(model, got, ref, mask)
    assert cache.engine.cache.num_sequences == 4  # 2 prompts x 2 beams
    cache.engine.cache.check_invariants()


def test_a_format_by_age_refuses_the_prefix_cache(seed):
    with pytest.raises(HexcoreConfigError, match="prefix_cache: not with a format by age"):
        make_cache(tiny_model(seed), kv_dtype="int2-aged", prefix_cache=True)


# -- the host side: rows, forks, refusals (no decode kernels) ------------------------------------
def rows_with_blocks(cache, lengths):
    """Rows whose sequences hold ``lengths`` tokens (block-manager state only)."""
    rows = []
    for n in lengths:
        seq = cache.engine.add()
        cache.engine.cache.grow_sequence(seq, n)
        rows.append(seq)
    cache.rows = rows
    return rows


def test_reorder_forks_shared_rows_and_frees_unused_ones(seed):
    cache = make_cache(tiny_model(seed))
    a, b, c = rows_with_blocks(cache, [40, 35, 20])
    free = cache.engine.cache.num_free_blocks
    cache.reorder_cache(torch.tensor([0, 0, 2]))  # beam 1 dropped, beam 0 continues twice
    first, fork, third = cache.rows
    assert first == a and third == c and fork not in (a, c)  # the fork may take b's freed slot
    assert cache.engine.cache.num_sequences == 3
    assert np.array_equal(cache.engine.cache.block_table(fork), cache.engine.cache.block_table(a))
    assert cache.engine.seq_len(fork) == 40
    assert cache.engine.cache.num_free_blocks == free + 2  # b's two blocks back; the fork copied none
    cache.batch_repeat_interleave(2)
    assert len(cache.rows) == 6 and cache.rows[0::2] == [first, fork, third]
    cache.batch_select_indices(torch.tensor([4]))
    assert cache.rows[0] == third and cache.engine.cache.num_sequences == 1
    cache.engine.cache.check_invariants()


def test_release_and_release_finished_free_rows(seed):
    cache = make_cache(tiny_model(seed))
    a, b = rows_with_blocks(cache, [33, 17])
    stop = cache.release_finished(eos_token_id=[1, 5])
    done = stop(torch.tensor([[7, 4], [7, 5]]), None)
    assert not done.any() and cache.rows == [a, -1] and not cache.engine.cache.is_live(b)
    cache.release([0])
    assert cache.rows == [-1, -1] and cache.engine.cache.num_sequences == 0
    with pytest.raises(HexcoreInvalidArgumentError, match="row"):
        cache.release([2])


def journal_rows(cache, lengths, seed, window=None, tokens=False):
    """Rows stored through Engine.prefill from random float16 K/V (and token ids when
    ``tokens``) that each row's journal keeps, as a prompt's commit does; the K/V per row."""
    cfg, gen = cache.kv_config, torch.Generator().manual_seed(seed % 2**31)
    cache.rows, cache._journals, kv = [], [], []
    if window is not None:
        cache.max_rollback = window
    for row, n in enumerate(lengths):
        k, v = (torch.randn((cfg.num_layers, n, cfg.num_kv_heads, cfg.head_dim), generator=gen).half()
                for _ in range(2))
        ids = torch.randint(3, 90, (n,), generator=gen).to(torch.int32).numpy() if tokens else None
        seq = cache.engine.add()
        cache.engine.prefill(seq, k.numpy(), v.numpy(), tokens=ids)
        cache.rows.append(seq)
        cache._journals.append(None)
        cache._remember(row, 0, k, v, ids)
        kv.append((k, v, ids))
    cache._length = max(lengths)
    return kv


def tail_rows(cache, seq, layer, count):
    """The first ``count`` rows of ``seq``'s tail in ``layer``'s K store: float16 [count, H, D]."""
    tail = cache.engine.store.k_tails
    host = tail.copy_to_host() if hasattr(tail, "copy_to_host") else tail.cpu().numpy()
    return np.transpose(host[layer, seq, :, :count], (1, 0, 2))


def test_crop_in_the_tail_or_on_a_boundary_only_shrinks_rows(seed):
    cache = make_cache(tiny_model(seed), max_rollback=0)
    rows_with_blocks(cache, [45, 37])
    cache._length = 45
    for n, lengths in [(0, [45, 37]), (50, [45, 37]),  # 5.x's "nothing"; the older absolute length, beyond
                       (-2, [43, 35]), (41, [41, 33]), (-1, [40, 32])]:  # negative: remove; positive: keep
        cache.crop(n)
        assert [cache.engine.seq_len(s) for s in cache.rows] == lengths and cache.get_seq_length() == lengths[0]
    cache.reset()
    _, b = rows_with_blocks(cache, [48, 32])
    cache._length, free = 48, cache.engine.cache.num_free_blocks
    cache.crop(-16)  # both on a boundary: a block of each goes back to the pool
    assert [cache.engine.seq_len(s) for s in cache.rows] == [32, 16]
    assert cache.engine.cache.num_free_blocks == free + 2 and len(cache.engine.cache.block_table(b)) == 1
    cache.engine.cache.check_invariants()


def test_crop_inside_a_sealed_block_without_a_journal_is_refused(seed):
    cache = make_cache(tiny_model(seed), max_rollback=0)
    rows_with_blocks(cache, [40, 35])
    cache._length = 40
    before = [cache.engine.cache.block_table(s).tolist() for s in cache.rows]
    for n, match in [(-4, r"max_length -4 would cut row 1 to 31 tokens, inside its sealed block 1 \(tokens "
                           r"\[16, 32\)\), and the cache kept nothing"),
                     (-41, "max_length -41 would remove 41 tokens, more than the cache's 40"),
                     (-40, "max_length -40 would remove 40 positions, but row 1 holds 35 tokens"),
                     (1.5, "max_length: expected an int, got float 1.5")]:
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            cache.crop(n)
    assert cache.get_seq_length() == 40  # no row changed, not even the first (40 -> 36 is in its tail)
    assert [cache.engine.seq_len(s) for s in cache.rows] == [40, 35]
    assert [cache.engine.cache.block_table(s).tolist() for s in cache.rows] == before
    cache.release([1])  # a released row is not cut
    cache.crop(-4)
    assert cache.rows[1] == -1 and cache.engine.seq_len(cache.rows[0]) == 36


def test_crop_inside_a_sealed_block_stores_the_kept_tokens_again(seed):
    cache = make_cache(tiny_model(seed))
    (k, _, _), _ = journal_rows(cache, [37, 20], seed)
    a = cache.rows[0]
    sealed = cache.engine.cache.block_table(a)
    cache.crop(-6)  # a: 37 -> 31, inside sealed block 1; b: 20 -> 14, inside sealed block 0
    assert [cache.engine.seq_len(s) for s in cache.rows] == [31, 14] and cache.get_seq_length() == 31
    assert cache.engine.cache.block_table(a).tolist() == sealed[:1].tolist()
    for layer in range(cache.kv_config.num_layers):  # a's tail holds its tokens 16..30 again, bit for bit
        np.testing.assert_array_equal(tail_rows(cache, a, layer, 15), k[layer, 16:31].numpy())
    assert [j.end for j in cache._journals] == [31, 14]  # what is gone is no longer kept
    cache.engine.cache.check_invariants()


def test_crop_deeper_than_the_journal_is_refused(seed):
    cache = make_cache(tiny_model(seed))
    journal_rows(cache, [37, 20], seed, window=4)  # a keeps [32, 37): its last 4 tokens and their block
    assert [(j.start, j.end) for j in cache._journals] == [(32, 37), (16, 20)]
    with pytest.raises(HexcoreInvalidArgumentError, match=r"cut row 0 to 31 tokens.* kept tokens \[32, 37\)"):
        cache.crop(-6)
    assert [cache.engine.seq_len(s) for s in cache.rows] == [37, 20]
    cache.crop(-3)  # a: 34 (its tail); b: 17, inside block 1 and in its journal
    assert [cache.engine.seq_len(s) for s in cache.rows] == [34, 17]


def test_crop_keeps_a_row_on_the_prefix_cache(seed):
    cache = make_cache(tiny_model(seed), prefix_cache=True)
    (_, _, ids), = journal_rows(cache, [37], seed, tokens=True)
    a, engine = cache.rows[0], cache.engine.cache
    cache.crop(-6)  # 37 -> 31: block 1 goes (it stays cached), tokens 16..30 are stored again with their ids
    assert engine.is_tracked(a) and engine.num_cached_blocks == 1
    assert engine.match_prefix(ids[:32]) == 32
    engine.check_invariants()


def draft_model(seed, candidates=5, **config):
    """A random-weight assistant that drafts ``candidates`` tokens every round (no early stop):
    unrelated to the main model, so most drafts are rejected and every round crops."""
    assistant = tiny_model(seed + 1, **config)
    assistant.generation_config.num_assistant_tokens = candidates
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    return assistant


def spy_crops(cache):
    """Record (max_length, length before) of each crop of ``cache``."""
    calls, crop = [], cache.crop

    def spy(max_length):
        calls.append((max_length, cache.get_seq_length()))
        crop(max_length)
    cache.crop = spy
    return calls


def test_assisted_decoding_fp16_matches_dynamic_cache(seed):
    # a 14-token prompt + 2 drafts (3 new tokens leave room for 2) seals block 0 (16 tokens);
    # rejecting a draft cuts inside it, and the row's journal stores the kept tokens again
    model = tiny_model(seed)
    assistant = draft_model(seed)
    ids, mask = ragged_prompts(seed, [14])
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 3, assistant_model=assistant)
    cache = make_cache(model)
    crops = spy_crops(cache)
    got = generate(model, cache, ids, mask, 3, assistant_model=assistant)
    same_greedy_path(got, ref)
    print(f"crops (max_length, length before): {crops}")
    after = [before + n if n < 0 else min(n or before, before) for n, before in crops]
    assert crops[0][1] == 16  # the first forward (prompt + drafts) sealed block 0
    # unless both drafts were accepted (about 1 in 96**2 with an unrelated assistant), the
    # first crop cut inside the sealed block: the journal's path
    assert 0 < after[0] < 16 or after[0] == 16 and crops[0][0] == 0, crops
    cache.engine.cache.check_invariants()


@pytest.mark.parametrize("change,match", [
    (dict(layer_types=["sliding_attention", "full_attention"], sliding_window=64), "layer_types"),
    (dict(head_dim=32), "head_dim"),
    (dict(attn_logit_softcapping=30.0), "softcapping"),
], ids=["sliding-layers", "head-dim-32", "softcap"])
def test_unsupported_architectures_are_refused(change, match):
    with pytest.raises(HexcoreConfigError, match=match):
        hx.HexcoreCache(tiny_config(**change), kv_dtype="fp16", max_tokens=64)


def test_mistral_window_shorter_than_the_cache_is_refused():
    cfg = tiny_config("mistral", sliding_window=128)
    with pytest.raises(HexcoreConfigError, match="sliding_window"):
        hx.HexcoreCache(cfg, kv_dtype="fp16", max_tokens=4096, block_size=16)
    cache = make_cache_for(cfg, max_seq_len=120)  # a window the cache never outgrows serves as full attention
    assert cache.capacity <= 128


def make_cache_for(cfg, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hx.HexcoreCache(cfg, kv_dtype="fp16", max_tokens=256, block_size=16, **kwargs)


def test_a_forward_of_another_batch_size_is_refused(seed):
    cache = make_cache(tiny_model(seed))
    rows_with_blocks(cache, [10])
    cache._length = 10
    key = torch.zeros((2, 2, 4, 64))
    with pytest.raises(HexcoreInvalidArgumentError, match="batch 2 differs from the cache's 1 rows"):
        cache.update(key, key, 0)
    assert cache.get_seq_length() == 10 and cache._extend is None


def test_a_model_without_hexcore_attention_is_caught_before_decoding(seed):
    model = tiny_model(seed)
    model.config._attn_implementation = "sdpa"  # the prompt never reaches the store
    ids, mask = ragged_prompts(seed, [5])
    with pytest.raises(HexcoreInvalidArgumentError, match="attn_implementation='hexcore'"):
        generate(model, make_cache(model), ids, mask, 2)


def test_hexcore_attention_without_a_hexcore_cache_is_sdpa(seed):
    model = tiny_model(seed)
    ids, mask = ragged_prompts(seed, [7, 4])
    got = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 3)
    model.config._attn_implementation = "sdpa"
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 3)
    assert torch.equal(got.sequences, ref.sequences)


# -- the prefix cache and prompts in several forwards ---------------------------------------------
def chat_turns(model, cache, seed, prompt_len, answer_tokens, user_len):
    """Turn 1 (a prompt of ``prompt_len`` tokens, ``answer_tokens`` new ones) on ``cache``,
    then turn 2's ids: turn 1's prompt + answer + ``user_len`` new tokens. Returns
    (turn 1's output, turn 2's ids)."""
    ids, _ = ragged_prompts(seed, [prompt_len])
    assert cache.admit(ids) == [0]
    first = generate(model, cache, ids, None, answer_tokens)
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, None, answer_tokens)
    assert worst_logits_error(first, ref) <= 2e-2  # identical tokens, or parted at a near-tie
    user, _ = ragged_prompts(seed + 1, [user_len])
    return first, torch.cat([first.sequences, user], dim=1)


def test_second_chat_turn_reuses_the_cached_prefix(seed):
    # turn 1: 31 prompt tokens seal block 0; the first decode step seals block 1 (with its token
    # ids, read by the model's hook). Turn 2 (31 + 2 + 6 tokens) finds both: 32 cached tokens,
    # and only its last 7 run through the model, over the cached blocks (Engine.prefill_attention)
    model = tiny_model(seed)
    cache = make_cache(model, prefix_cache=True)
    _, ids = chat_turns(model, cache, seed, 31, 2, 6)
    assert cache.admit(ids) == [32] and cache.get_seq_length() == 32
    stats = cache.engine.cache.prefix_cache_stats()
    assert stats["hits"] == 32 and stats["queries"] == 31 + ids.shape[1]  # turn 1's prompt + turn 2's
    got = generate(model, cache, ids, None, 2)
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, None, 2)
    assert torch.equal(got.sequences, ref.sequences)
    for step, (a, b) in enumerate(zip(got.logits, ref.logits)):
        assert relative_error(a, b) <= 5e-3, step
    assert cache.engine.seq_len(cache.rows[0]) == ids.shape[1] + 1
    cache.reset()
    assert cache.engine.cache.num_cached_blocks == 2  # turn 2's prompt re-sealed nothing new; both stay cached
    cache.engine.cache.check_invariants()


def test_a_mask_hiding_a_cached_token_is_refused_and_changes_nothing(seed):
    # turn 2's ids hold a padding id (0) at a cached position: generate() without a mask would
    # hide it, which hexcore cannot do for a token it holds (it would attend to it anyway)
    model = tiny_model(seed)
    cache = make_cache(model, prefix_cache=True)
    _, ids = chat_turns(model, cache, seed, 31, 2, 6)
    assert cache.admit(ids) == [32]
    hole = torch.ones_like(ids)
    hole[0, 5] = 0
    with pytest.raises(HexcoreInvalidArgumentError, match=r"attention_mask: row 0 hides 1 of the 32 positions"):
        generate(model, cache, ids, hole, 2)
    assert cache.get_seq_length() == 32 and cache.engine.seq_len(cache.rows[0]) == 32
    got = generate(model, cache, ids, None, 2)
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, None, 2)
    assert torch.equal(got.sequences, ref.sequences)
    cache.engine.cache.check_invariants()


@pytest.mark.parametrize("lengths,layers,crop", [([21, 12], 1, 2), ([21, 21], 2, 8)], ids=["ragged", "unpadded"])
def test_chunked_prefill_of_a_batch_matches_dynamic_cache(lengths, layers, crop, seed):
    """Chunks of 8. Ragged: the short row is all padding in the first chunk, the later
    chunks attend over a partial tail (Engine.prefill_attention), and a crop after left
    padding still maps positions onto each row's tokens. Unpadded: every chunk after the
    first has every row live and every position real, so Extend stages all rows with one op
    per buffer and returns the engine's output; a crop into sealed block 0 stores its kept
    tokens again from the rows' journals (views of one staging)."""
    model = tiny_model(seed, layers=layers)
    ids, mask = ragged_prompts(seed, lengths)
    kwargs = dict(prefill_chunk_size=8)
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 2, **kwargs)
    cache = make_cache(model)
    got = generate(model, cache, ids, mask, 2, **kwargs)
    assert torch.equal(got.sequences, ref.sequences)
    for step, (a, b) in enumerate(zip(got.logits, ref.logits)):
        assert relative_error(a, b) <= 5e-3, step
    assert [cache.engine.seq_len(s) for s in cache.rows] == [n + 1 for n in lengths]
    cache.crop(-crop)
    assert [cache.engine.seq_len(s) for s in cache.rows] == [n + 1 - crop for n in lengths]
    cache.engine.cache.check_invariants()


def test_crop_after_right_padding_is_refused(seed):
    model = tiny_model(seed, layers=1)
    ids, mask = ragged_prompts(seed, [9, 6])
    mask[1] = torch.flip(mask[1], [0])  # row 1 right-padded: its positions 6..8 are padding
    cache = make_cache(model)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    with pytest.raises(HexcoreInvalidArgumentError, match="max_length -1: row 1's prompt has padding after a real"):
        cache.crop(-1)
    assert [cache.engine.seq_len(s) for s in cache.rows] == [9, 6]
    cache.reset()
    assert cache._crop_blocked is None


def test_more_tokens_than_a_row_has_room_for_are_refused(seed):
    model = tiny_model(seed)
    cache = make_cache(model, max_seq_len=32)
    rows_with_blocks(cache, [20])
    cache._length = 20
    ids, _ = ragged_prompts(seed, [15])
    with pytest.raises(HexcoreInvalidArgumentError, match="row 0 would hold 35 tokens"), torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == 20 and cache.engine.seq_len(cache.rows[0]) == 20 and not cache._in_forward()


@pytest.mark.parametrize("pads,hits,start", [
    ([0], [48], 48),  # one row: its whole hit
    ([0, 16], [48, 32], 48),  # pads a whole block apart: each row its own hit
    ([0, 12], [48, 32], 0),  # pads 12 apart: no position is a block boundary of both rows
    ([0, 40], [48, 0], 32),  # row 1 is all padding up to 40: row 0 stops at its last boundary before
    ([3, 3], [16, 32], 19),  # unpadded-alike rows: the shorter hit
])
def test_common_cached_length(pads, hits, start):
    from hexcore.integrations._hf_prefix import common_cached_length

    assert common_cached_length(53, pads, hits, 16) == start


def cache_prompt(cache, tokens):
    """Index ``tokens``' whole blocks in ``cache``'s prefix cache (block manager only) and free the sequence."""
    manager = cache.engine.cache
    adm = manager.admit(tokens)
    manager.grow_sequence(adm.seq_id, len(tokens), tokens=tokens[adm.cached_tokens:])
    manager.free_sequence(adm.seq_id)


def test_admit_of_a_ragged_batch_shares_whole_blocks(seed):
    model = tiny_model(seed)
    cache = make_cache(model, prefix_cache=True)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, 96, 50, dtype=np.int32)
    cache_prompt(cache, prompt)
    ids = torch.zeros((2, 53), dtype=torch.long)
    mask = torch.zeros_like(ids)
    ids[0], mask[0] = torch.from_numpy(np.r_[prompt, [5, 6, 7]].astype(np.int64)), 1
    ids[1, 16:], mask[1, 16:] = torch.from_numpy(np.r_[prompt[:32], [8, 9, 10, 11, 12]].astype(np.int64)), 1
    assert cache.admit(ids, mask) == [48, 32] and cache.get_seq_length() == 48
    first, second = (cache.engine.cache.block_table(s) for s in cache.rows)
    assert np.array_equal(first[:2], second[:2])  # the two leading blocks shared by reference
    ids[1], mask[1] = 0, 0  # 12 pads: no position is a block boundary of both rows
    ids[1, 12:], mask[1, 12:] = torch.from_numpy(np.r_[prompt[:32], np.arange(3, 12)].astype(np.int64)), 1
    assert cache.admit(ids, mask) == [0, 0] and cache.rows == [] and cache.get_seq_length() == 0
    cache.engine.cache.check_invariants()


def test_admit_without_the_prefix_cache_frees_the_rows(seed):
    cache = make_cache(tiny_model(seed))
    rows_with_blocks(cache, [40])
    cache._length = 40
    assert cache.admit(torch.arange(3, 40).unsqueeze(0)) == [0]
    assert cache.rows == [] and cache.get_seq_length() == 0
    assert cache.engine.cache.num_free_blocks == cache.engine.store.num_blocks


@pytest.mark.parametrize("ids,mask,match", [
    (torch.ones((1, 4)), None, "input_ids: expected an int tensor"),
    (torch.ones((1, 4), dtype=torch.long), torch.tensor([[1, 1, 0, 0]]), "row 0 is not left padding.*position 2"),
    (torch.ones((1, 4), dtype=torch.long), torch.tensor([[0, 0, 0, 0]]), "row 0 is all padding"),
    (torch.full((1, 4), 2**31), None, r"input_ids\[0\]: token ids must fit int32"),
    (torch.ones((1, 4), dtype=torch.long), torch.ones((1, 3)), r"expected shape \(1, 4\)"),
    (torch.ones((9, 4), dtype=torch.long), None, "9 rows exceed the cache's max_seqs 8"),
], ids=["float-ids", "right-padding", "all-padding", "id-beyond-int32", "mask-shape", "too-many-rows"])
def test_admit_refuses_bad_input_and_keeps_the_rows(seed, ids, mask, match):
    cache = make_cache(tiny_model(seed), prefix_cache=True)
    rows = rows_with_blocks(cache, [20])
    cache._length = 20
    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        cache.admit(ids, mask)
    assert cache.rows == rows and cache.get_seq_length() == 20


def test_prefix_cache_needs_the_model_and_installs_one_hook(seed):
    model = tiny_model(seed)
    with pytest.raises(HexcoreConfigError, match="build the cache from the model"):
        hx.HexcoreCache(model.config, kv_dtype="fp16", max_tokens=256, prefix_cache=True)
    with pytest.raises(HexcoreInvalidArgumentError, match="priority"):
        hx.HexcoreCache(model, kv_dtype="fp16", max_tokens=256, prefix_cache=True, priority=8)
    make_cache(model, prefix_cache=True)
    make_cache(model, prefix_cache=True)
    assert len(model._forward_pre_hooks) == 1


# -- on the H200 ---------------------------------------------------------------------------------
ARCHS = [dict(arch="llama", head_dim=64, q_heads=8, kv_heads=2, layers=4),
         dict(arch="qwen2", head_dim=128, q_heads=8, kv_heads=4, layers=2),
         dict(arch="mistral", head_dim=128, q_heads=4, kv_heads=1, layers=3)]
ARCH_IDS = ["llama-gqa-d64", "qwen2-d128", "mistral-mqa-d128"]


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS, ids=ARCH_IDS)
@pytest.mark.parametrize("lengths,chunk", [([37], None), ([45, 12, 33, 20], None), ([45, 12, 33, 20], 16)],
                         ids=["batch1", "ragged4", "ragged4-chunked16"])
def test_gpu_fp16_generate_is_token_identical(arch, lengths, chunk, seed):
    # chunked: the prompt prefilled 16 tokens at a time (each chunk over what the rows hold)
    model = tiny_model(seed, **arch)
    ids, mask = ragged_prompts(seed, lengths)
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 32)
    cache = make_cache(model, block_size=32)
    got = generate(model, cache, ids, mask, 32, **({} if chunk is None else {"prefill_chunk_size": chunk}))
    worst = worst_logits_error(got, ref)
    print(f"fp16 {ARCH_IDS[ARCHS.index(arch)]} {lengths} chunk {chunk}: worst logits rel err {worst:.2e}")
    assert worst <= 2e-2


@pytest.mark.gpu
def test_gpu_beam_search_matches_dynamic_cache(seed):
    model = tiny_model(seed, **ARCHS[0])
    ids, mask = ragged_prompts(seed, [29, 18])
    ref = beam_search(model, ids, transformers.DynamicCache(config=model.config), mask=mask)
    cache = make_cache(model, max_seqs=16, block_size=32)
    got = beam_search(model, ids, cache, mask=mask)
    check_beam_search(model, got, ref, mask)
    assert cache.engine.cache.num_sequences == 8  # 2 prompts x 4 beams: forks replaced dropped beams
    cache.engine.cache.check_invariants()


def forced_logits(model, cache, ids, tokens):
    """Logits of each step with ``tokens`` ``[B, steps]`` fed back (teacher forcing): [steps * B, vocab]."""
    out = []
    with torch.no_grad():
        logits = model(ids, past_key_values=cache, use_cache=True).logits[:, -1]
        for t in range(tokens.shape[1]):
            out.append(logits)
            logits = model(tokens[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.cat(out)


@pytest.mark.gpu
# Random-weight models have near-tied logits and Gaussian K/V, on which INT4's error is
# about 10% of the attention output (the demo's figure): measured on the H200 (2026-12-01),
# INT4 agreed on 44-58% of teacher-forced next tokens and INT2 on 6-9% (chance: about 1%) over one row of 64
# tokens; one run fell to 1.6% (2026-12-01, session 4), so four rows (256 tokens: INT2's spread about 1.6%,
# chance's 0.6%). The bounds below catch a broken path (garbage agrees at chance); quality on a real model is
# benchmarks/bench_quality.py. The formats by age hold these rows (at most 264 tokens) in FP16 and INT4
# only (int2-aged re-seals to INT2 at 384 tokens of age): INT4's bound.
@pytest.mark.parametrize("kv_dtype,agreement", [("int4", 0.3), ("int2", 0.03), ("int4-aged", 0.3),
                                                ("int2-aged", 0.3)])
@pytest.mark.parametrize("arch", ARCHS, ids=ARCH_IDS)
def test_gpu_quantized_agreement_with_fp16(arch, kv_dtype, agreement, seed):
    model = tiny_model(seed, **arch)
    ids, _ = ragged_prompts(seed, [200] * 4)  # six sealed blocks of 32 per row before the first decode step
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, None, 64)
    tokens = ref.sequences[:, ids.shape[1]:]
    fp16 = forced_logits(model, make_cache(model, "fp16", block_size=32), ids, tokens)
    quant = forced_logits(model, make_cache(model, kv_dtype, block_size=32), ids, tokens)
    top1 = float((quant.argmax(-1) == fp16.argmax(-1)).float().mean())
    rel = relative_error(quant, fp16)
    print(f"{kv_dtype} {ARCH_IDS[ARCHS.index(arch)]}: top-1 agreement {top1:.3f}, logits rel err {rel:.3e}")
    assert torch.isfinite(quant).all() and top1 >= agreement


@pytest.mark.gpu
def test_gpu_rows_released_at_eos_free_their_blocks(seed):
    model = tiny_model(seed, **ARCHS[0])
    ids, mask = ragged_prompts(seed, [40, 21, 33])
    cache = make_cache(model, block_size=16)
    # eos: row 1's third greedy token, probed with the processing the runs below use (no
    # min_new_tokens mask; an end-of-sequence id past the vocabulary, so no row stops early).
    # A probe with min_new_tokens masks the config's eos id and may take another path on the
    # H200's float16 (seed 588596600915019044: row 1 never emitted the probed id).
    vocab = model.config.vocab_size
    probe = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 3, eos_token_id=vocab,
                     min_new_tokens=0)
    eos = int(probe.sequences[1, -1])
    if eos == 0:
        pytest.skip("row 1's third token is the padding id")
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 24, eos_token_id=eos,
                   min_new_tokens=0)
    # row 1 ends by its third token (counted from the prompt: every row may stop before 24
    # steps, which shortens the sequences; seed 6345833622268609105 on the H200, 2026-12-02)
    first_three = ref.sequences[1, ids.shape[1]:ids.shape[1] + 3].tolist()
    assert eos in first_three, (eos, first_three)
    got = generate(model, cache, ids, mask, 24, eos_token_id=eos, min_new_tokens=0,
                   stopping_criteria=transformers.StoppingCriteriaList([cache.release_finished(eos)]))
    # identical, or parted at a near-tie (an exact comparison failed once on the H200, 2026-12-01,
    # seed 5242171282386976434: row 0 took another token; its gap was not recorded)
    if same_greedy_path(got, ref) > 2:
        assert cache.rows[1] == -1  # row 1 emitted eos at its third token: released
    cache.engine.cache.check_invariants()


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS, ids=ARCH_IDS)
def test_gpu_second_chat_turn_on_the_prefix_cache_is_token_identical(arch, seed):
    # turn 1: 100 prompt tokens + 32 new; turn 2 adds 20 user tokens and finds every whole
    # block of turn 1 that its decode sealed, with the token ids read by the model's hook
    model = tiny_model(seed, **arch)
    cache = make_cache(model, prefix_cache=True, block_size=32)
    first, ids = chat_turns(model, cache, seed, 100, 32, 20)
    held = 100 + 32 - 1  # the last answer token never ran through the model
    assert cache.admit(ids) == [held // 32 * 32]
    got = generate(model, cache, ids, None, 32)
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, None, 32)
    worst = worst_logits_error(got, ref)
    print(f"prefix turn 2 {ARCH_IDS[ARCHS.index(arch)]}: {held // 32 * 32} cached tokens, worst logits rel err "
          f"{worst:.2e}")
    assert worst <= 2e-2
    cache.engine.cache.check_invariants()


@pytest.mark.gpu
def test_gpu_beam_search_on_the_prefix_cache_matches_dynamic_cache(seed):
    # generate() repeats the prompt for the beams but not a filled cache: admit the repeated rows
    model = tiny_model(seed, **ARCHS[0])
    cache = make_cache(model, prefix_cache=True, max_seqs=16, block_size=32)
    _, ids = chat_turns(model, cache, seed, 70, 8, 10)
    assert cache.admit(ids.repeat_interleave(4, dim=0)) == [64] * 4
    got = beam_search(model, ids, cache)  # with a mask of ones: turn 1's answer may hold the padding id
    ref = beam_search(model, ids, transformers.DynamicCache(config=model.config))
    check_beam_search(model, got, ref, torch.ones_like(ids))
    cache.engine.cache.check_invariants()


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS, ids=ARCH_IDS)
def test_gpu_assisted_decoding_is_token_identical(arch, seed):
    # 5 drafts a round from an unrelated assistant: nearly every round crops, many inside a
    # block the verification forward sealed (block_size 32)
    model, assistant = tiny_model(seed, **arch), draft_model(seed, **arch)
    ids, mask = ragged_prompts(seed, [37])
    ref = generate(model, transformers.DynamicCache(config=model.config), ids, mask, 32, assistant_model=assistant)
    cache = make_cache(model, block_size=32)
    crops = spy_crops(cache)
    got = generate(model, cache, ids, mask, 32, assistant_model=assistant)
    worst = worst_logits_error(got, ref)
    print(f"assisted fp16 {ARCH_IDS[ARCHS.index(arch)]}: {len(crops)} crops, worst logits rel err {worst:.2e}")
    assert worst <= 2e-2 and len(crops) >= 4
    cache.engine.cache.check_invariants()


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["int4", "fp16"])
@pytest.mark.parametrize("prefix_cache", [False, True], ids=["plain", "prefix"])
def test_gpu_assisted_decoding_follows_plain_greedy_on_the_same_cache(kv_dtype, prefix_cache, seed):
    # greedy assisted decoding must give greedy decoding's tokens, up to a near-tie. Until the
    # first block sealed during decoding (step 64 - 45 = 19) both paths attend over the same
    # sealed block 0 (from the same prompt forward) and FP16 tails a few ulps apart. From then
    # on an INT4 cache quantizes K/V that the two paths computed in forwards of other shapes,
    # a code that flips moves a score by a quantization step, and the paths may part anywhere
    # (H200, 2026-12-01: twice at step 19, at top-2 gaps of 9.4% and 16% of the largest logit)
    model, assistant = tiny_model(seed, **ARCHS[0]), draft_model(seed, **ARCHS[0])
    ids, mask = ragged_prompts(seed, [45])
    ref = generate(model, make_cache(model, kv_dtype, block_size=32, prefix_cache=prefix_cache), ids, mask, 32)
    cache = make_cache(model, kv_dtype, block_size=32, prefix_cache=prefix_cache)
    got = generate(model, cache, ids, mask, 32, assistant_model=assistant)
    same_greedy_path(got, ref, margin=3e-2, until=64 - 45 if kv_dtype == "int4" else None)
    cache.engine.cache.check_invariants()
