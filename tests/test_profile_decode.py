"""benchmarks.profile_decode's --lineinfo: kernels (only) compiled with numba's line table."""

from numba import cuda

from benchmarks import profile_decode


def test_with_lineinfo_sets_it_for_kernels_only(monkeypatch):
    seen = []
    monkeypatch.setattr(cuda, "jit", lambda *args, **kwargs: seen.append(kwargs))
    profile_decode.with_lineinfo()
    cuda.jit(max_registers=128)
    cuda.jit(device=True)
    cuda.jit(debug=True)
    cuda.jit(lineinfo=False)
    assert seen == [{"max_registers": 128, "lineinfo": True}, {"device": True}, {"debug": True},
                    {"lineinfo": False}]
