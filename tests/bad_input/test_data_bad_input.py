"""Bad data files not covered by the per-pipeline catalogues: empty and truncated files, NaN and
infinities, shape mismatches, files of the wrong kind; for the three file-reading inputs (TESLA's
samples ``network.path``/``network.truth``, the MRF of ``model.path``, SVI's corpus). Each: exit code
2, one line naming the field and the file, the problem and the fix, before any task runs."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tests.bad_input.helpers import assert_refused, pgmflow


def _pm1(shape, seed=0):
    return np.random.default_rng(seed).choice(np.array([-1, 1], np.int8), size=shape)


def _ring(n=6):
    J = np.zeros((n, n))
    for i in range(n):
        J[i, (i + 1) % n] = J[(i + 1) % n, i] = 0.7
    return J


def _write(path, content: bytes, args):
    path.write_bytes(content)
    return args


def _mkdir(path, args):
    path.mkdir()
    return args


def _truncate(path):
    b = path.read_bytes()
    path.write_bytes(b[: len(b) // 2])


# --- TESLA samples -------------------------------------------------------------------------------

NET = ["pipeline=tesla", "network=npz", "network.path=data.npz"]
CSV = ["pipeline=tesla", "network=csv", "network.path=data.csv"]


def _net(p, **arrays):
    np.savez(p / "data.npz", **arrays)
    return NET


def _net_empty(p):
    (p / "data.npz").write_bytes(b"")
    return NET, ["network.path='data.npz'", "file is empty"]


def _net_truncated(p):
    _net(p, X=_pm1((6, 20, 8)))
    _truncate(p / "data.npz")
    return NET, ["network.path='data.npz'", "not an .npz file"]


def _net_inf(p):
    X = _pm1((4, 3, 5)).astype(np.float64)
    X[3, 2, 1] = -np.inf
    return _net(p, X=X), ["network.path='data.npz'", "infinite value -inf at X[3, 2, 1]"]


def _truth_shape(p):
    np.savez(p / "truth.npz", edges=np.zeros((3, 3), bool))  # the data have 5 nodes
    return (
        _net(p, X=_pm1((4, 3, 5))) + ["network.truth=truth.npz"],
        ["network.truth='truth.npz'", "edges has shape (3, 3)", "(4, 5, 5)"],
    )


def _csv(p, text):
    (p / "data.csv").write_text(text)
    return CSV


CASES = {
    "samples_empty_npz": _net_empty,
    "samples_truncated_npz": _net_truncated,
    "samples_infinite_value": _net_inf,
    "samples_2d_array": lambda p: (_net(p, X=_pm1((4, 5))), ["network.path='data.npz'", "X has shape (4, 5) (2-D)"]),
    "samples_times_length": lambda p: (
        _net(p, X=_pm1((4, 3, 5)), times=np.arange(3)),
        ["network.path='data.npz'", "times has shape (3,)", "4 time points"],
    ),
    "samples_node_names_length": lambda p: (
        _net(p, X=_pm1((4, 3, 5)), node_names=np.array(list("abc"))),
        ["network.path='data.npz'", "node_names has shape (3,)", "5 nodes"],
    ),
    "samples_unexpected_array": lambda p: (
        _net(p, Y=_pm1((4, 3, 5))),
        ["network.path='data.npz'", "unexpected keys ['Y']"],
    ),
    "samples_path_is_a_directory": lambda p: (
        _mkdir(p / "data.npz", NET),
        ["network.path='data.npz'", "not a regular file"],
    ),
    "truth_shape_mismatch": _truth_shape,
    "csv_nan": lambda p: (
        _csv(p, "time,sample,node,value\n0,0,a,1\n0,0,b,nan\n1,0,a,1\n1,0,b,-1\n"),
        ["network.path='data.csv'", "NaN at line 3"],
    ),
    "csv_header_only": lambda p: (_csv(p, "time,sample,node,value\n"), ["network.path='data.csv'", "no data rows"]),
    "csv_wrong_columns": lambda p: (
        _csv(p, "t,s,n,v\n0,0,a,1\n"),
        ["network.path='data.csv'", "unexpected columns ['t', 's', 'n', 'v']"],
    ),
}


# --- an MRF from a file (pipeline=bounds model=mrf) --------------------------------------------

MRF = ["pipeline=bounds", "model=mrf", "model.path=model.npz"]


def _mrf(p, **arrays):
    np.savez(p / "model.npz", **arrays)
    return MRF


def _mrf_truncated(p):
    _mrf(p, J=np.zeros((200, 200)))
    _truncate(p / "model.npz")
    return MRF, ["model.path='model.npz'", "cannot read it as .npz/.npy (BadZipFile)"]


def _mrf_j_inf(p):
    J = _ring()
    J[0, 1] = J[1, 0] = np.inf
    return _mrf(p, J=J), ["model.path='model.npz'", "J entry [0, 1] is inf"]


CASES.update(
    {
        "mrf_empty_file": lambda p: (
            _write(p / "model.npz", b"", MRF),
            ["model.path='model.npz'", "cannot read it as .npz/.npy (EOFError)"],
        ),
        "mrf_truncated_npz": _mrf_truncated,
        "mrf_text_file": lambda p: (
            _write(p / "model.npz", b"J = [[0, 1], [1, 0]]\n", MRF),
            ["model.path='model.npz'", "cannot read it as .npz/.npy"],
        ),
        "mrf_infinite_coupling": _mrf_j_inf,
        "mrf_field_length": lambda p: (
            _mrf(p, J=_ring(), h=np.zeros(4)),
            ["model.path='model.npz'", "h has shape (4,), the couplings need (6,)"],
        ),
        "mrf_rho_matrix_shape": lambda p: (
            _mrf(p, J=_ring(), rho=np.ones((3, 3))),
            ["model.path='model.npz'", "rho has shape (3, 3)"],
        ),
        "mrf_couplings_1d": lambda p: (_mrf(p, J=np.ones(6)), ["model.path='model.npz'", "J has shape (6,)"]),
        "mrf_no_couplings": lambda p: (_mrf(p, K=_ring()), ["model.path='model.npz'", "has no array 'J' (found: K)"]),
        "mrf_nonzero_diagonal": lambda p: (
            _mrf(p, J=_ring() + np.eye(6)),
            ["model.path='model.npz'", "J diagonal entry [0, 0] is 1"],
        ),
    }
)


# --- SVI corpora --------------------------------------------------------------------------------

SPARSE = ["pipeline=svi", "corpus=npz", "corpus.path=c.npz"]


def _sparse(p, X):
    sp.save_npz(p / "c.npz", sp.csr_matrix(X))
    return SPARSE


def _sparse_truncated(p):
    _sparse(p, np.ones((50, 30)))
    (p / "c.npz").write_bytes((p / "c.npz").read_bytes()[:200])
    return SPARSE, ["corpus.path='c.npz'", "not a scipy.sparse .npz file (BadZipFile"]


def _dense(p):
    np.savez(p / "c.npz", X=np.ones((5, 5)))  # a dense array where a scipy.sparse matrix belongs
    return SPARSE


def _uci(p, docword, vocab="a\nb\nc\nd\n"):
    (p / "docword.txt").write_text(docword)
    (p / "vocab.txt").write_text(vocab)
    return ["pipeline=svi", "corpus=uci", "corpus.docword=docword.txt", "corpus.vocab=vocab.txt"]


CASES.update(
    {
        "corpus_empty_npz": lambda p: (
            _write(p / "c.npz", b"", SPARSE),
            ["corpus.path='c.npz'", "not a scipy.sparse .npz file (EOFError"],
        ),
        "corpus_truncated_npz": _sparse_truncated,
        "corpus_nan_count": lambda p: (
            _sparse(p, np.where(np.eye(20, 30) > 0, np.nan, 1.0)),
            ["corpus.path='c.npz'", "non-finite count (nan for word 0"],
        ),
        "corpus_infinite_count": lambda p: (
            _sparse(p, np.where(np.eye(20, 30) > 0, np.inf, 1.0)),
            ["corpus.path='c.npz'", "non-finite count (inf for word 0"],
        ),
        "corpus_dense_array": lambda p: (_dense(p), ["corpus.path='c.npz'", "does not contain a sparse array"]),
        "corpus_all_zero": lambda p: (_sparse(p, np.zeros((20, 30))), ["corpus.path='c.npz'", "the corpus is empty"]),
        "uci_truncated": lambda p: (
            _uci(p, "3\n4\n6\n1 1 2\n1 2 1\n2 3 1\n"),
            ["corpus.docword='docword.txt'", "the header says 6 lines but the file has 3"],
        ),
        "uci_nan_count": lambda p: (
            _uci(p, "2\n4\n2\n1 1 nan\n2 2 1\n"),
            ["corpus.docword='docword.txt'", "line 4 is not three integers"],
        ),
        "uci_word_id_out_of_range": lambda p: (
            _uci(p, "2\n4\n2\n1 9 1\n2 2 1\n"),
            ["corpus.docword='docword.txt'", "wordID 9 is outside 1..W = 4"],
        ),
        "uci_empty_vocabulary": lambda p: (
            _uci(p, "2\n4\n2\n1 1 1\n2 2 1\n", vocab=""),
            ["corpus.docword='docword.txt'", "vocabulary-size mismatch: 0 lines"],
        ),
        "uci_empty_docword": lambda p: (_uci(p, ""), ["corpus.docword='docword.txt'", "the header ends after 0 lines"]),
    }
)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(v.values[0], marks=v.marks, id=k) if hasattr(v, "values") else pytest.param(v, id=k)
        for k, v in CASES.items()
    ],
)
def test_data_bad_input(tmp_path, make):
    args, needles = make(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow([*args, f"tracking.uri={uri}", "progress=false"], tmp_path)
    pipeline = next(a.split("=")[1] for a in args if a.startswith("pipeline="))
    assert_refused(r, needles, tmp_path, uri, pipeline)
