"""Formats: construction, validation, names, capabilities, mode-order changes."""

import pytest
import torch

import scorch
from scorch import Format, compressed, dense, padded, singleton
from scorch.format import preset, resolve


def test_user_defined_csc_equals_preset():
    f = Format([dense, compressed], order=(1, 0))
    assert f == scorch.formats.csc
    assert f.name == "csc" and str(f) == "csc"


@pytest.mark.parametrize("name,levels,order", [
    ("csr", ("dense", "compressed"), (0, 1)),
    ("csc", ("dense", "compressed"), (1, 0)),
    ("dcsr", ("compressed", "compressed"), (0, 1)),
    ("dcsc", ("compressed", "compressed"), (1, 0)),
    ("coo", ("compressed", "singleton"), (0, 1)),
    ("ell", ("dense", "padded"), (0, 1)),
    ("dense", ("dense", "dense"), (0, 1)),
])
def test_presets_2d(name, levels, order):
    f = preset(name, 2)
    assert tuple(lv.kind for lv in f.levels) == levels
    assert f.order == order
    assert f.name == name


def test_coo_levels_are_nonunique_then_singletons():
    f = preset("coo", 3)
    assert [lv.kind for lv in f.levels] == ["compressed", "singleton", "singleton"]
    assert [lv.unique for lv in f.levels] == [False, False, True]


def test_nd_presets_adapt():
    assert [lv.kind for lv in preset("csr", 3).levels] == ["dense", "dense", "compressed"]
    assert preset("csc", 3).order == (0, 2, 1)
    assert scorch.formats.csf(4) == Format([compressed] * 4)
    assert preset("csr", 1) == Format([compressed])


def test_bsr_and_bsc():
    b = scorch.formats.bsr(2, 3)
    assert b.block == (2, 3) and b.ndim == 2 and b.name == "bsr2x3"
    assert b.stored_shape((4, 9)) == (2, 3, 2, 3)
    assert b.level_sizes((4, 9)) == (2, 3, 2, 3)
    c = scorch.formats.bsc(2, 3)
    assert c.level_sizes((4, 9)) == (3, 2, 2, 3)


def test_capabilities():
    assert dense.full and dense.can_locate and not dense.has_crd
    assert compressed.has_pos and compressed.has_crd and not compressed.full
    assert singleton.has_crd and not singleton.has_pos
    assert padded.may_pad and padded.has_crd
    assert not compressed(unique=False).unique


def test_permuted_is_a_mode_order_change():
    assert scorch.formats.csr.permuted((1, 0)) == scorch.formats.csc
    assert scorch.formats.bsr(2, 3).permuted((1, 0)) == Format(
        [dense, compressed, dense, dense], order=(1, 0, 3, 2), block=(3, 2))
    f = Format([dense, compressed, dense], order=(2, 0, 1))
    assert f.permuted((0, 1, 2)) == f


@pytest.mark.parametrize("bad,match", [
    (lambda: Format([]), "must not be empty"),
    (lambda: Format([dense, compressed], order=(0, 0)), "permutation"),
    (lambda: Format([dense, singleton]), "singleton level 1 must follow a nonunique"),
    (lambda: Format([compressed(unique=False), compressed]), "followed by a singleton"),
    (lambda: Format([dense, compressed], block=(2, 2)), "needs 4 levels"),
    (lambda: Format([dense, compressed, dense, dense], block=(0, 2)), "positive"),
    (lambda: Format(["dense"]), "must be a Level"),
    (lambda: scorch.Level("sparse"), "kind must be one of"),
    (lambda: preset("csx", 2), "unknown format name 'csx'"),
    (lambda: preset("bsr", 2), r"bsr\(bh, bw\)"),
    (lambda: preset("csc", 1), "at least 2 dims"),
    (lambda: scorch.formats.bsr(0, 2), "positive ints"),
    (lambda: resolve(scorch.formats.csr, 3), "pass format='csr' as a string"),
    (lambda: resolve("csc", 1, arg="set_weight: out_format"), "^set_weight: out_format: format 'csc' needs a tensor"),
    (lambda: resolve(scorch.formats.bsr(2, 2), 4, arg="x"), r"^x: .* give scorch.Format\(levels, order, block\) 8 levels"),
])
def test_bad_formats_raise_clear_errors(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bad()


def test_resolve_rejects_non_formats():
    with pytest.raises(TypeError, match="format must be a format name"):
        resolve(3, 2)


def test_spec_round_trip():
    for f in [scorch.formats.coo, scorch.formats.bsr(2, 2), Format([dense, padded], order=(1, 0))]:
        assert Format.from_spec(f.to_spec()) == f


def test_format_cache_key_follows_equality_and_pickling():
    """Equal formats share the int that keys the kernel caches, different ones never do; a
    pickled format gets this process's key and hash back (not the ones it was saved with)."""
    import pickle
    csc = scorch.Format([scorch.dense, scorch.compressed], order=(1, 0))
    assert csc._key == scorch.formats.csc._key and csc._key != scorch.formats.csr._key
    keys = {f._key for f in (scorch.formats.coo, scorch.formats.csr, scorch.formats.csc, scorch.formats.dcsr,
                             scorch.formats.ell, scorch.formats.bsr(2, 2))}
    assert len(keys) == 6
    saved = pickle.loads(pickle.dumps(csc))
    object.__setattr__(csc, "_key", -1)          # as if saved by a process that numbered formats otherwise
    object.__setattr__(csc, "_hash", -1)
    back = pickle.loads(pickle.dumps(csc))
    assert back == saved and back._key == saved._key == scorch.formats.csc._key
    assert hash(back) == hash(scorch.formats.csc)


def test_a_blocked_formats_hint_works():
    """A 2-d blocked format for a 4-d tensor suggested "pass format='bsr2x2' as a string", a name no
    call takes; the hint now describes a Format with a block size per dim, and that Format resolves."""
    with pytest.raises(ValueError) as err:
        resolve(scorch.formats.bsr(2, 2), 4, arg="out_format")
    assert "as a string" not in str(err.value) and "'bsr2x2'" not in str(err.value)
    with pytest.raises(ValueError, match="unknown format name 'bsr2x2'"):
        scorch.as_sparse(torch.ones(2, 2), "bsr2x2")   # (so it must not be suggested)
    four = Format([dense, compressed, dense, dense] + [dense] * 4, order=tuple(range(8)), block=(2, 2, 1, 1))
    assert resolve(four, 4, arg="out_format") is four
    w = torch.arange(64.).reshape(4, 4, 2, 2) * (torch.arange(4) % 2 == 0).view(4, 1, 1, 1)
    assert torch.equal(scorch.as_sparse(w, four).to_dense(), w)
