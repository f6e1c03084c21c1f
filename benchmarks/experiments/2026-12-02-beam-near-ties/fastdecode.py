"""Replace the simulator's paged decode kernel by a numpy computation that reads the same
store through the same block tables / seq_lens / tail slots (the bookkeeping under test is
unchanged: only the attention arithmetic is done by numpy instead of simulated threads)."""
import contextlib, numpy as np
from hexcore.cuda.simulated import launches

def _host(a):
    return a.copy_to_host()

def numpy_decode(store, args):
    cfg = store.config
    bs, H, D = cfg.block_size, cfg.num_kv_heads, cfg.head_dim
    q_words, tables, lens, slots, out = args[7], args[8], args[9], args[10], args[11]
    layer, scale = int(args[15]), float(args[20])
    tables, lens, slots = _host(tables), _host(lens), _host(slots)
    B = tables.shape[0]
    q = _host(q_words).view(np.float16).reshape(B, -1, D).astype(np.float32)
    Hq = q.shape[1]; G = Hq // H
    kc, vc = store.k_codes._ary if hasattr(store.k_codes, "_ary") else _host(store.k_codes), None
    kc, vc = _host(store.k_codes)[layer], _host(store.v_codes)[layer]
    kt, vt = _host(store.k_tails)[layer], _host(store.v_tails)[layer]
    res = np.zeros((B, Hq, D), np.float32)
    for b in range(B):
        n = int(lens[b])
        if n <= 0:
            continue
        full, rest = divmod(n, bs)
        blocks = tables[b, :full]
        K = [kc[blk].transpose(1, 0, 2) for blk in blocks] + [kt[slots[b]][:, :rest].transpose(1, 0, 2)]
        V = [vc[blk].transpose(1, 0, 2) for blk in blocks] + [vt[slots[b]][:, :rest].transpose(1, 0, 2)]
        K = np.concatenate(K, 0).astype(np.float32)  # [n, H, D]
        V = np.concatenate(V, 0).astype(np.float32)
        for h in range(Hq):
            s = K[:, h // G] @ q[b, h] * scale
            p = np.exp(s - s.max()); p /= p.sum()
            res[b, h] = p @ V[:, h // G]
    flat = res.astype(np.float16).reshape(-1)
    o = out._ary if hasattr(out, "_ary") else None
    o[:flat.size] = flat

@contextlib.contextmanager
def fast_decode(engine, check=False):
    def hook(kernel, args, launch):
        fn = getattr(kernel, "fn", None)
        if fn is not None and fn.__name__ == "kernel" and fn.__module__.endswith("attention.kernel") and len(args) == 21:
            if check:
                launch()
                want = args[11]._ary.copy()
                numpy_decode(engine.store, args)
                got = args[11]._ary
                err = np.abs(got.astype(np.float32) - want.astype(np.float32)).max()
                print("decode check max abs err", err, "of", np.abs(want.astype(np.float32)).max())
                return
            return numpy_decode(engine.store, args)
        return launch()
    with launches(hook):
        yield
