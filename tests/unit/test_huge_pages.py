"""platforms/huge_pages.py: the decisions for hosts we do not have (THP never, no MADV_COLLAPSE,
refusals, holes between mappings) through a stand-in madvise, and the real call on this host."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from paddle_llm_engine.platforms.huge_pages import (HUGE, MADV_COLLAPSE, MADV_HUGEPAGE, advise_huge_pages,
                                                    anonymous_mappings, huge_regions, paddle_cpu_ranges,
                                                    tensor_ranges, thp_mode)

MIB = 1 << 20


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                                        ("always madvise [never]", "never"), ("garbage", "unknown")])
def test_thp_mode(tmp_path, text, mode):
    p = tmp_path / "enabled"
    p.write_text(text)
    assert thp_mode(str(p)) == mode
    assert thp_mode(str(tmp_path / "missing")) == "unknown"


def test_regions_round_outward_inside_the_mapping_and_merge():
    m = [(10 * HUGE, 20 * HUGE)]
    # a tensor from 10.5 to 12.5 regions: regions 10, 11, 12 (outward), one run
    assert huge_regions([(int(10.5 * HUGE), 2 * HUGE)], m) == [(10 * HUGE, 3 * HUGE)]
    # two tensors in regions 11 and 12 merge; one in 15 stays apart
    assert huge_regions([(11 * HUGE + 5, 100), (12 * HUGE, 10), (15 * HUGE + 1, 1)], m) == \
        [(11 * HUGE, 2 * HUGE), (15 * HUGE, HUGE)]
    # a mapping that starts or ends inside a region: only the regions wholly inside it
    m2 = [(int(10.5 * HUGE), int(13.5 * HUGE))]
    assert huge_regions([(int(10.5 * HUGE), 3 * HUGE)], m2) == [(11 * HUGE, 2 * HUGE)]
    # a tensor in a mapping smaller than a region, or outside every mapping: nothing
    assert huge_regions([(30 * HUGE + 4096, 8192)], [(30 * HUGE + 4096, 30 * HUGE + 3 * 4096)]) == []
    assert huge_regions([(50 * HUGE, HUGE)], m) == []
    # a tensor over two mappings with a hole between them: each mapping's regions, not the hole
    m3 = [(0, 4 * HUGE), (6 * HUGE, 9 * HUGE)]
    assert huge_regions([(HUGE, 7 * HUGE)], m3) == [(HUGE, 3 * HUGE), (6 * HUGE, 2 * HUGE)]
    assert huge_regions([(0, 0)], m) == []


class FakeMadvise:
    """A stand-in madvise: records calls, answers from a table advice -> errno."""

    def __init__(self, answers=None):
        self.calls, self.answers = [], answers or {}

    def __call__(self, addr, length, advice):
        self.calls.append((addr, length, advice))
        return self.answers.get(advice, 0)


MAPS = [(0, 64 * HUGE)]
TENSORS = [(2 * HUGE, 3 * HUGE), (10 * HUGE, HUGE)]


def test_never_and_unknown_touch_nothing():
    for mode in ("never", "unknown"):
        fake = FakeMadvise()
        rep = advise_huge_pages(TENSORS, fake, mode=mode, mappings=MAPS)
        assert fake.calls == [] and rep.advised_bytes == 0 and rep.tensor_bytes == 4 * HUGE
        assert repr(mode) in rep.outcome and "4 KiB pages" in rep.outcome


def test_advise_then_collapse_every_run():
    fake = FakeMadvise()
    rep = advise_huge_pages(TENSORS, fake, mode="madvise", mappings=MAPS)
    assert fake.calls == [(2 * HUGE, 3 * HUGE, MADV_HUGEPAGE), (2 * HUGE, 3 * HUGE, MADV_COLLAPSE),
                          (10 * HUGE, HUGE, MADV_HUGEPAGE), (10 * HUGE, HUGE, MADV_COLLAPSE)]
    assert rep.advised_bytes == rep.collapsed_bytes == 4 * HUGE
    assert "8 MiB collapsed" in rep.outcome


def test_no_collapse_on_old_kernels_is_reported():
    fake = FakeMadvise({MADV_COLLAPSE: errno.EINVAL})
    rep = advise_huge_pages(TENSORS, fake, mode="always", mappings=MAPS)
    assert rep.advised_bytes == 4 * HUGE and rep.collapsed_bytes == 0
    assert "MADV_COLLAPSE unsupported" in rep.outcome and "khugepaged" in rep.outcome


def test_refusal_is_reported_and_nothing_raised():
    fake = FakeMadvise({MADV_HUGEPAGE: errno.EPERM})
    rep = advise_huge_pages(TENSORS, fake, mode="madvise", mappings=MAPS)
    assert rep.advised_bytes == 0 and [c[2] for c in fake.calls] == [MADV_HUGEPAGE, MADV_HUGEPAGE]
    assert "refused (EPERM)" in rep.outcome


def test_collapse_off_only_advises():
    fake = FakeMadvise()
    rep = advise_huge_pages(TENSORS, fake, mode="madvise", mappings=MAPS, collapse=False)
    assert {c[2] for c in fake.calls} == {MADV_HUGEPAGE} and rep.collapsed_bytes == 0
    assert "khugepaged" in rep.outcome


class _T:
    def __init__(self, addr, n):
        self.addr, self.n = addr, n


class _Linear:
    def __init__(self, w, b):
        self.weight, self.bias = w, b

    def __call__(self, x):  # callable objects are still walked
        return x


def test_tensor_ranges_walks_objects_once():
    shared = _T(100, 50)
    model = type("M", (), {})()
    model.layers = [_Linear(_T(1000, 10), None), _Linear(shared, _T(2000, 0))]
    model.head = shared
    model.cfg = {"k": _T(3000, 7)}
    got = tensor_ranges(model, lambda x: isinstance(x, _T), lambda t: (t.addr, t.n))
    assert got == [(100, 50), (1000, 10), (3000, 7)]


def test_on_this_host():
    """The real madvise on an 8 MiB array: whatever the host allows is reported, never raised; where
    THP is on, the array's inner regions are advised."""
    import paddle

    a = paddle.to_tensor(np.ones(8 * MIB // 4, np.float32))
    ranges = paddle_cpu_ranges({"a": a, "b": [a]})
    assert ranges == [(a.data_ptr(), 8 * MIB)]
    assert any(s <= a.data_ptr() < e for s, e in anonymous_mappings())
    rep = advise_huge_pages(ranges)
    assert rep.tensor_bytes == 8 * MIB and rep.outcome
    if thp_mode() in ("always", "madvise"):
        assert rep.advised_bytes >= 2 * HUGE  # at least two whole regions inside 8 MiB
    np.testing.assert_array_equal(a.numpy(), 1.0)  # contents unchanged


def test_engine_outputs_unchanged(tiny_model_dir):
    from test_engine_tiny import greedy, make_engine, prompt, run

    reqs = {f"r{i}": (prompt(7 + i, salt=10 + i), greedy(10)) for i in range(2)}
    outs = []
    for hp in (0, 1):
        engine = make_engine(tiny_model_dir, huge_pages=hp)
        outs.append({r: v["tokens"] for r, v in run(engine, reqs).items()})
        engine.close()
    assert outs[0] == outs[1]
