"""pgmflow.tasks.tesla.data: round trips through npz (both layouts) and CSV, every input error, recoding."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pgmflow.tasks.tesla import data as D


def _X(seed=0, T=4, n=3, p=5):
    r = np.random.default_rng(seed)
    return np.where(r.random((T, n, p)) < 0.5, 1, -1).astype(np.int8)


def _same(a: D.BinaryTimeSeries, b: D.BinaryTimeSeries):
    assert np.array_equal(a.X, b.X) and a.X.dtype == b.X.dtype == np.int8
    assert np.array_equal(a.tix, b.tix) and a.tix.dtype == np.int64
    assert np.array_equal(a.n_per_time, b.n_per_time)
    assert np.array_equal(a.times, b.times)
    assert list(a.node_names) == list(b.node_names)
    assert a.recoded_from_01 == b.recoded_from_01


def _err(exc_info, path, *words):
    e = exc_info.value
    msg = str(e)
    assert msg == f"{e.path}: {e.problem}; fix: {e.fix}"
    assert "\n" not in msg
    assert str(path) in msg, msg
    assert e.fix
    for w in words:
        assert w in msg, msg
    return msg


def _write_csv(path, text):
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------------
# the in-memory form
# ------------------------------------------------------------------------------------------------


def test_from_array_fields():
    X = _X()
    d = D.from_array(X, node_names=list("abcde"), times=[0.5, 1.5, 2.5, 3.5])
    assert (d.T, d.p, d.N) == (4, 5, 12)
    assert np.array_equal(d.X, X.reshape(12, 5))
    assert np.array_equal(d.tix, np.repeat(np.arange(4), 3))
    assert np.array_equal(d.n_per_time, [3, 3, 3, 3])
    assert np.array_equal(d.times, [0.5, 1.5, 2.5, 3.5]) and d.times.dtype == np.float64
    assert d.node_names == list("abcde") and d.recoded_from_01 is False
    assert np.array_equal(d.at(2), X[2]) and np.array_equal(d.offsets, [0, 3, 6, 9, 12])
    d0 = D.from_array(X)
    assert np.array_equal(d0.times, np.arange(4)) and d0.node_names == ["0", "1", "2", "3", "4"]


def test_unsorted_times_are_put_in_order():
    X = _X(T=3)
    d = D.from_array(X, times=[30, 10, 20])
    assert np.array_equal(d.times, [10, 20, 30])
    assert np.array_equal(d.at(0), X[1]) and np.array_equal(d.at(1), X[2]) and np.array_equal(d.at(2), X[0])


def test_from_arrays_with_varying_sizes():
    xs = [_X(1, 1, 2, 4)[0], _X(2, 1, 5, 4)[0], _X(3, 1, 1, 4)[0]]
    d = D.from_arrays(xs)
    assert np.array_equal(d.n_per_time, [2, 5, 1]) and d.N == 8
    assert np.array_equal(d.tix, [0, 0, 1, 1, 1, 1, 1, 2])
    assert np.array_equal(d.X, np.concatenate(xs))


def test_recoding_from_01():
    X01 = (_X() > 0).astype(np.uint8)
    d = D.from_array(X01)
    assert d.recoded_from_01 is True
    assert np.array_equal(d.X, np.where(X01 == 0, -1, 1).reshape(-1, 5))
    b = D.from_array(X01.astype(bool))
    assert b.recoded_from_01 and np.array_equal(b.X, d.X)
    assert D.from_array(np.ones((2, 2, 3))).recoded_from_01 is False  # all ones: already -1/+1


def test_constant_nodes():
    X = _X(T=3, n=4, p=6)
    X[:, :, 1] = 1
    X[:, :, 4] = -1
    X[:, :, 5] = 1
    X[2, 3, 5] = -1  # changes once: not constant
    d = D.from_array(X)
    assert np.array_equal(D.constant_nodes(d), [1, 4])
    assert D.constant_nodes(d).dtype == np.int64


def test_error_is_picklable():
    e = D.TeslaDataError("f.npz", "bad", "fix it")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is D.TeslaDataError and str(e2) == str(e) == "f.npz: bad; fix: fix it"
    assert (e2.path, e2.problem, e2.fix) == ("f.npz", "bad", "fix it")
    assert isinstance(e2, ValueError)


# ------------------------------------------------------------------------------------------------
# round trips
# ------------------------------------------------------------------------------------------------


def test_npz_round_trip_stacked(tmp_path):
    d = D.from_array(_X(), node_names=["g1", "g2", "g3", "g4", "g5"], times=[2, 4, 6, 8])
    D.save_npz(d, tmp_path / "s.npz", layout="stacked")
    with np.load(tmp_path / "s.npz") as z:
        assert sorted(z.files) == ["X", "node_names", "times"]
    _same(d, D.load_npz(tmp_path / "s.npz"))
    _same(d, D.load(tmp_path / "s.npz"))


def test_npz_round_trip_list_layout(tmp_path):
    xs = [_X(1, 1, 2, 4)[0], _X(2, 1, 5, 4)[0], _X(3, 1, 1, 4)[0]]
    d = D.from_arrays(xs, node_names=["a", "b", "c", "d"], times=["day1", "day2", "day3"])
    D.save_npz(d, tmp_path / "l.npz")  # auto: varying sizes -> list
    with np.load(tmp_path / "l.npz") as z:
        assert sorted(z.files) == ["node_names", "times", "x_0", "x_1", "x_2"]
    _same(d, D.load_npz(tmp_path / "l.npz"))
    # a hand-written file without the optional keys
    np.savez(tmp_path / "h.npz", **{f"x_{t}": x for t, x in enumerate(xs)})
    h = D.load_npz(tmp_path / "h.npz")
    assert np.array_equal(h.X, d.X) and np.array_equal(h.n_per_time, [2, 5, 1])
    # stacked data written as a list give the same arrays
    s = D.from_array(_X())
    D.save_npz(s, tmp_path / "sl.npz", layout="list")
    _same(s, D.load_npz(tmp_path / "sl.npz"))
    with pytest.raises(ValueError, match="stacked"):
        D.save_npz(d, tmp_path / "bad.npz", layout="stacked")


@pytest.mark.parametrize("times", [None, [0.5, 1.25, 2.0, 10.0], ["a", "b", "c", "d"]])
def test_csv_round_trip(tmp_path, times):
    d = D.from_array(_X(), node_names=["n1", "n 2", "n,3", "x", "y"], times=times)
    D.save_csv(d, tmp_path / "d.csv")
    _same(d, D.load_csv(tmp_path / "d.csv"))
    _same(d, D.load(tmp_path / "d.csv"))


def test_csv_varying_sizes_round_trip(tmp_path):
    d = D.from_arrays([_X(1, 1, 2, 4)[0], _X(2, 1, 5, 4)[0], _X(3, 1, 1, 4)[0]])
    D.save_csv(d, tmp_path / "v.csv")
    _same(d, D.load_csv(tmp_path / "v.csv"))


def test_all_three_formats_agree(tmp_path):
    X = _X(7, T=5, n=4, p=6)
    d = D.from_array(X)
    D.save_npz(d, tmp_path / "a.npz", layout="stacked")
    D.save_npz(d, tmp_path / "b.npz", layout="list")
    D.save_csv(d, tmp_path / "c.csv")
    for f in ("a.npz", "b.npz", "c.csv"):
        e = D.load(tmp_path / f)
        assert np.array_equal(e.X.reshape(X.shape), X)


def test_csv_column_order_sorting_and_01(tmp_path):
    # columns in another order, times numeric (sorted numerically, not lexicographically), 0/1 values
    text = "value,node,sample,time\n"
    rows = []
    for t in (10, 2, 1):
        for s in ("s1", "s0"):
            for node, v in (("b", t % 2), ("a", 1), ("c", 0)):
                rows.append(f"{v},{node},{s},{t}")
    f = _write_csv(tmp_path / "o.csv", text + "\n".join(rows) + "\n")
    d = D.load_csv(f)
    assert np.array_equal(d.times, [1, 2, 10]) and d.times.dtype == np.int64
    assert d.node_names == ["b", "a", "c"]
    assert d.recoded_from_01 is True
    assert np.array_equal(d.n_per_time, [2, 2, 2])
    assert np.array_equal(d.at(0), [[1, 1, -1], [1, 1, -1]])  # t=1: b=1, a=1, c=0 -> -1
    assert np.array_equal(d.at(1), [[-1, 1, -1], [-1, 1, -1]])  # t=2: b=0 -> -1


def test_csv_string_times_sorted_lexicographically_and_numeric_merge(tmp_path):
    text = "time,sample,node,value\n" + "".join(f"{t},0,{n},1\n" for t in ("b", "a10", "a9") for n in ("u", "v"))
    d = D.load_csv(_write_csv(tmp_path / "s.csv", text))
    assert list(d.times) == ["a10", "a9", "b"]
    text = "time,sample,node,value\n1,0,u,1\n1,0,v,-1\n1.0,1,u,-1\n1.0,1,v,1\n2.5,0,u,1\n2.5,0,v,1\n"
    d = D.load_csv(_write_csv(tmp_path / "m.csv", text))
    assert np.array_equal(d.times, [1.0, 2.5]) and np.array_equal(d.n_per_time, [2, 1])


def test_csv_blank_lines_whitespace_and_bom(tmp_path):
    text = "\ufeff time , sample ,node,value\n\n0, s ,a,1\n0,s,b,-1\n\n"
    d = D.load_csv(_write_csv(tmp_path / "w.csv", text))
    assert d.node_names == ["a", "b"] and np.array_equal(d.X, [[1, -1]])


# ------------------------------------------------------------------------------------------------
# errors: files
# ------------------------------------------------------------------------------------------------


def test_missing_empty_and_corrupt_files(tmp_path):
    for loader in (D.load_npz, D.load_csv):
        with pytest.raises(D.TeslaDataError) as ei:
            loader(tmp_path / "nope.npz")
        _err(ei, tmp_path / "nope.npz", "not found")
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "empty.npz")
    _err(ei, "empty.npz", "empty")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(tmp_path / "empty.csv")
    _err(ei, "empty.csv", "empty")
    (tmp_path / "junk.npz").write_bytes(b"this is not a zip file at all")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "junk.npz")
    _err(ei, "junk.npz", "not a zip")
    D.save_npz(D.from_array(_X()), tmp_path / "ok.npz")
    (tmp_path / "bin.csv").write_bytes((tmp_path / "ok.npz").read_bytes())
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(tmp_path / "bin.csv")
    _err(ei, "bin.csv")
    raw = bytearray((tmp_path / "ok.npz").read_bytes())
    (tmp_path / "trunc.npz").write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "trunc.npz")
    _err(ei, "trunc.npz")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load(tmp_path / "data.xlsx")
    _err(ei, "data.xlsx", ".xlsx")


def test_npz_object_array_is_refused(tmp_path):
    np.savez(tmp_path / "o.npz", X=_X(), node_names=np.array(["a", 1, None, "d", "e"], dtype=object))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "o.npz")
    _err(ei, "o.npz", "object")


def test_npz_keys(tmp_path):
    np.savez(tmp_path / "k1.npz", X=_X(), x_0=_X()[0])
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "k1.npz")
    _err(ei, "k1.npz", "both key X")
    np.savez(tmp_path / "k2.npz", X=_X(), weights=np.ones(3))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "k2.npz")
    _err(ei, "k2.npz", "unexpected keys", "weights")
    np.savez(tmp_path / "k3.npz", data=_X())
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "k3.npz")
    _err(ei, "k3.npz", "data")
    np.savez(tmp_path / "k4.npz", x_0=_X()[0], x_1=_X()[1], x_3=_X()[2])
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "k4.npz")
    _err(ei, "k4.npz", "x_2 is missing")
    np.savez(tmp_path / "k5.npz", times=np.arange(3))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "k5.npz")
    _err(ei, "k5.npz", "no data keys")


# ------------------------------------------------------------------------------------------------
# errors: shapes and values (npz, array)
# ------------------------------------------------------------------------------------------------


def test_wrong_ndim(tmp_path):
    np.savez(tmp_path / "nd.npz", X=_X()[0])
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "nd.npz")
    _err(ei, "nd.npz", "(3, 5)", "3-D")
    np.savez(tmp_path / "nd1.npz", x_0=_X()[0], x_1=_X()[1][0])
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "nd1.npz")
    _err(ei, "nd1.npz", "x_1 has shape (5,)")
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(np.ones((2, 2, 2, 2)))
    _err(ei, "<array>", "4-D")


def test_mismatched_p(tmp_path):
    xs = {f"x_{t}": _X(t, 1, 3, 20)[0] for t in range(5)}
    xs["x_3"] = _X(3, 1, 3, 19)[0]
    np.savez(tmp_path / "mp.npz", **xs)
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "mp.npz")
    _err(ei, "mp.npz", "x_3 has 19 columns", "x_0 has 20")


def test_zero_samples(tmp_path):
    np.savez(tmp_path / "z.npz", x_0=_X()[0], x_1=np.zeros((0, 5)), x_2=_X()[2])
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "z.npz")
    _err(ei, "z.npz", "x_1 has zero samples")
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(np.zeros((3, 0, 5)))
    _err(ei, "<array>", "zero samples")


def test_too_few_nodes(tmp_path):
    np.savez(tmp_path / "p1.npz", X=np.ones((3, 4, 1)))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "p1.npz")
    _err(ei, "p1.npz", "p=1", "at least 2")


def test_non_binary_value_names_time_sample_node(tmp_path):
    X = _X().astype(np.float64)
    X[2, 1, 3] = 2.0
    np.savez(tmp_path / "nb.npz", X=X, times=np.array([5, 6, 7, 8]), node_names=np.array(list("abcde")))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "nb.npz")
    _err(ei, "nb.npz", "value 2 ", "time 7", "sample 1", "node 'd'", "not binary")
    xs = [_X()[0], _X()[1].astype(float)]
    xs[1][2, 0] = 0.5
    np.savez(tmp_path / "nb2.npz", x_0=xs[0], x_1=xs[1])
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "nb2.npz")
    _err(ei, "nb2.npz", "value 0.5", "x_1 row 2, column 0", "node '0'")


def test_mixed_codings_are_refused():
    X = _X()
    X[0, 0, 0] = 0
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(X)
    _err(ei, "<array>", "mix", "value 0 at X[0, 0, 0]", "value -1")


@pytest.mark.parametrize("bad,word", [(np.nan, "NaN"), (np.inf, "infinite value inf"), (-np.inf, "infinite")])
def test_nan_and_inf(tmp_path, bad, word):
    X = _X().astype(np.float64)
    X[1, 2, 4] = bad
    np.savez(tmp_path / "nan.npz", X=X)
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_npz(tmp_path / "nan.npz")
    _err(ei, "nan.npz", word, "X[1, 2, 4]", "time 1", "sample 2", "node '4'")


def test_bad_labels():
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(_X(), node_names=["a", "b"])
    _err(ei, "<array>", "node_names", "5 nodes")
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(_X(), node_names=["a", "b", "c", "a", "e"])
    _err(ei, "<array>", "'a'", "unique")
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(_X(), times=[1, 2, 3])
    _err(ei, "<array>", "times", "4 time points")
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(_X(), times=[1, 2, 2, 3])
    _err(ei, "<array>", "time label 2", "more than once")
    with pytest.raises(D.TeslaDataError) as ei:
        D.from_array(np.array([[["a", "b"]]]))
    _err(ei, "<array>", "dtype")


# ------------------------------------------------------------------------------------------------
# errors: CSV
# ------------------------------------------------------------------------------------------------

GOOD = "time,sample,node,value\n0,a,g1,1\n0,a,g2,-1\n0,b,g1,1\n0,b,g2,1\n1,a,g1,-1\n1,a,g2,-1\n"


def test_good_csv_reference(tmp_path):
    d = D.load_csv(_write_csv(tmp_path / "g.csv", GOOD))
    assert np.array_equal(d.X, [[1, -1], [1, 1], [-1, -1]]) and np.array_equal(d.n_per_time, [2, 1])


def test_csv_header_problems(tmp_path):
    f = _write_csv(
        tmp_path / "x.csv",
        GOOD.replace("time,sample,node,value", "time,sample,node,value,batch")
        .replace(",1\n", ",1,q\n")
        .replace(",-1\n", ",-1,q\n"),
    )
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "x.csv", "unexpected columns", "batch")
    f = _write_csv(tmp_path / "m.csv", "time,node,value\n0,g1,1\n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "m.csv", "lacks columns", "sample")
    f = _write_csv(tmp_path / "h.csv", "time,sample,node,value\n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "h.csv", "no data rows")
    f = _write_csv(tmp_path / "d.csv", "time,sample,node,node\n0,a,b,1\n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "d.csv", "repeats", "node")
    f = _write_csv(tmp_path / "blank.csv", "\n\n  \n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "blank.csv", "no header")


def test_csv_row_problems(tmp_path):
    f = _write_csv(tmp_path / "r.csv", GOOD + "1,b,g1\n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "r.csv", "line 8", "3 fields")
    f = _write_csv(tmp_path / "e.csv", GOOD + "1,,g1,1\n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "e.csv", "empty sample", "line 8")


@pytest.mark.parametrize(
    "value,word",
    [("2", "value 2 "), ("0.5", "value 0.5"), ("abc", "'abc'"), ("nan", "NaN"), ("inf", "infinite"), ("", "''")],
)
def test_csv_bad_values(tmp_path, value, word):
    f = _write_csv(tmp_path / "v.csv", GOOD.replace("0,b,g2,1", f"0,b,g2,{value}"))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "v.csv", word, "line 5", "time '0'", "sample 'b'", "node 'g2'")


def test_csv_mixed_codings(tmp_path):
    f = _write_csv(tmp_path / "mix.csv", GOOD.replace("1,a,g1,-1", "1,a,g1,0"))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "mix.csv", "mix", "line 6", "line 3")


def test_csv_missing_and_duplicate_nodes(tmp_path):
    f = _write_csv(tmp_path / "miss.csv", GOOD.replace("1,a,g2,-1\n", ""))
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "miss.csv", "time '1', sample 'a'", "no value for node 'g2'")
    f = _write_csv(tmp_path / "dup.csv", GOOD + "0,b,g1,-1\n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "dup.csv", "time '0', sample 'b'", "2 values for node 'g1'", "lines 4, 8")


def test_csv_single_node(tmp_path):
    f = _write_csv(tmp_path / "one.csv", "time,sample,node,value\n0,a,g1,1\n1,a,g1,-1\n")
    with pytest.raises(D.TeslaDataError) as ei:
        D.load_csv(f)
    _err(ei, "one.csv", "p=1", "'g1'")
