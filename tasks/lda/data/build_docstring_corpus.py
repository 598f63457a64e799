"""Build the shipped corpus ``numpy_scipy_docstrings`` from the installed NumPy and SciPy.

Each document is the docstring of one public function, class, ufunc, distribution object or public
method of a public class of NumPy / SciPy, with the sections that are code or cross references
removed (Examples, See Also, References, Methods, and SciPy's generated "Array API Standard
Support" tables) and reST/LaTeX markup stripped. Exact duplicates
(re-exported objects, inherited methods, docstrings copied between modules) are kept once, and
documents with fewer than ``MIN_TOKENS`` words after tokenisation are skipped. The text is then
tokenised and pruned with :func:`pgmflow.tasks.lda.corpus.from_documents` (the same code as
``from_text_folder``) and written in the ``pgmflow-corpus/1`` format together with the document
names (``doc_names.txt``, e.g. ``scipy.linalg.svd``), the licence texts copied from the installed
packages (``LICENSE.txt``) and a ``README.md``.

Only objects defined by NumPy or SciPy count: attributes inherited from Python's builtins or the
standard library (e.g. the ``str`` methods of ``numpy.str_``) are skipped, their docstrings being
under another licence. The Fortran wrappers of scipy.linalg.blas/lapack are left out (generated
signatures, not prose).

Run from the repository root::

    .venv/bin/python tasks/lda/data/build_docstring_corpus.py [OUT_DIR]

The result depends on the installed NumPy and SciPy versions (recorded in meta.json and README.md).
"""

from __future__ import annotations

import importlib
import inspect
import platform
import re
import sys
import warnings
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pgmflow.tasks.lda import corpus
from pgmflow.tasks.lda.stopwords import ENGLISH_STOP_WORDS

NAME = "numpy_scipy_docstrings"
MIN_TOKENS = 10
MIN_DF, MAX_DF, MAX_VOCAB = 3, 0.25, 6000
DOCS_PER_SHARD = 1000

MODULES = [
    "numpy", "numpy.linalg", "numpy.fft", "numpy.random", "numpy.ma", "numpy.polynomial",
    "numpy.polynomial.polynomial", "numpy.polynomial.chebyshev", "numpy.polynomial.legendre",
    "numpy.polynomial.hermite", "numpy.polynomial.hermite_e", "numpy.polynomial.laguerre",
    "numpy.lib", "numpy.lib.stride_tricks", "numpy.lib.recfunctions", "numpy.lib.scimath",
    "numpy.lib.npyio", "numpy.lib.format", "numpy.rec", "numpy.char", "numpy.strings", "numpy.testing",
    "numpy.exceptions", "numpy.dtypes",
    "scipy.cluster.vq", "scipy.cluster.hierarchy", "scipy.constants", "scipy.datasets",
    "scipy.differentiate", "scipy.fft", "scipy.fftpack", "scipy.integrate", "scipy.interpolate",
    "scipy.io", "scipy.io.wavfile", "scipy.io.arff", "scipy.io.matlab", "scipy.linalg",
    "scipy.linalg.interpolative", "scipy.ndimage", "scipy.odr", "scipy.optimize",
    "scipy.optimize.elementwise", "scipy.signal", "scipy.signal.windows", "scipy.sparse",
    "scipy.sparse.linalg", "scipy.sparse.csgraph", "scipy.spatial", "scipy.spatial.distance",
    "scipy.spatial.transform", "scipy.special", "scipy.stats", "scipy.stats.contingency",
    "scipy.stats.qmc", "scipy.stats.mstats", "scipy.stats.sampling",
]

DROP_SECTIONS = {"examples", "example", "see also", "references", "methods", "array api standard support"}

# Words of the docstring conventions themselves (types, section names, reST), not topics.
EXTRA_STOP_WORDS = {
    "optional", "default", "defaults", "parameter", "parameters", "return", "returns", "returned",
    "array_like", "none", "true", "false", "int", "float", "bool", "str", "tuple", "list", "ndarray",
    "np", "scipy", "numpy", "sp", "versionadded", "versionchanged", "deprecated", "note", "notes",
    "see", "also", "e.g", "i.e", "eg", "func", "meth", "attr", "class", "obj", "mod", "ref", "math",
    "doc", "code", "type", "object", "objects", "given", "input", "output", "result", "results",
    "raise", "raises", "must", "may", "can", "will", "new", "one", "two", "whether", "instead",
}


def _public_objects():
    """``(name, obj)`` of every public object of MODULES and the public attributes of its classes."""
    for mod_name in MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        for name in sorted(set(names)):
            try:
                obj = getattr(mod, name)
            except AttributeError:
                continue
            if inspect.ismodule(obj):
                continue
            yield f"{mod_name}.{name}", obj
            if inspect.isclass(obj):
                for attr in sorted(a for a in dir(obj) if not a.startswith("_")):
                    try:
                        member = getattr(obj, attr)
                    except AttributeError:
                        continue
                    yield f"{mod_name}.{name}.{attr}", member


def _foreign_docs() -> set:
    """Every docstring of Python's builtins (types and their attributes): never ours."""
    import builtins

    docs = set()
    for obj in vars(builtins).values():
        docs.add(getattr(obj, "__doc__", None))
        if inspect.isclass(obj):
            for member in vars(obj).values():
                docs.add(getattr(member, "__doc__", None))
    docs.discard(None)
    return docs


_FOREIGN_DOCS = _foreign_docs()
_SECTION_RULE = re.compile(r"^\s*-{3,}\s*$")
_BOLD_TITLE = re.compile(r"^\s*\*\*([^*]+)\*\*\s*$")  # e.g. **Array API Standard Support**
_ROLE = re.compile(r":[a-zA-Z_:]+:`")
_DIRECTIVE = re.compile(r"^\s*\.\. [a-zA-Z_-]+::.*$", re.MULTILINE)
_LATEX = re.compile(r"\\[A-Za-z]+")
_URL = re.compile(r"https?://\S+")


def clean_docstring(doc: str) -> str:
    """The prose of a numpydoc docstring: drop code/cross-reference sections, doctest lines, markup."""
    lines = inspect.cleandoc(doc).splitlines()
    out, drop, i = [], False, 0
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and _SECTION_RULE.match(lines[i + 1]):
            drop = line.strip().lower() in DROP_SECTIONS
            i += 2
            continue
        bold = _BOLD_TITLE.match(line)
        if bold:
            drop = bold.group(1).strip().lower() in DROP_SECTIONS
            i += 1
            continue
        if not drop and not line.lstrip().startswith((">>>", "...")):
            out.append(line)
        i += 1
    text = "\n".join(out)
    text = _DIRECTIVE.sub(" ", text)
    text = _ROLE.sub("`", text)
    text = _URL.sub(" ", text)
    text = _LATEX.sub(" ", text)
    return text


def _origin(obj) -> str:
    """The module that defines ``obj`` (for a method descriptor: its class's module)."""
    if isinstance(obj, property):
        obj = obj.fget
    obj = getattr(obj, "__func__", obj)  # classmethod / staticmethod / bound method
    objclass = getattr(obj, "__objclass__", None)
    if objclass is not None:  # method, getset and member descriptors of extension types
        return str(getattr(objclass, "__module__", ""))
    if inspect.isclass(obj) or inspect.isroutine(obj) or hasattr(obj, "__wrapped__"):
        return str(getattr(obj, "__module__", None) or "")
    mod = getattr(type(obj), "__module__", "")  # instances: ufuncs, distribution objects
    if mod == "numpy" and type(obj).__name__ == "ufunc":
        return "numpy"
    return str(mod)


def _ours(obj) -> bool:
    """Whether ``obj`` is defined by NumPy or SciPy (not Python's builtins or the standard library,
    whose docstrings are under another licence)."""
    return _origin(obj).split(".")[0] in ("numpy", "scipy")


def collect(stop_words) -> tuple[list[str], list[str]]:
    """``(names, texts)`` of the documents, in a fixed order (module list, then sorted names)."""
    seen_raw, seen_text = set(), set()  # (ids of transient attribute objects are reused: not a key)
    names, texts = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, obj in _public_objects():
            doc = getattr(obj, "__doc__", None)
            if not isinstance(doc, str) or doc in seen_raw or doc in _FOREIGN_DOCS:
                continue
            if not _ours(obj):
                continue
            seen_raw.add(doc)
            text = clean_docstring(doc)
            if text in seen_text or len(corpus.tokenize(text, 2, stop_words)) < MIN_TOKENS:
                continue
            seen_text.add(text)
            names.append(name)
            texts.append(text)
    return names, texts


def _licence_text(dist: str) -> str:
    """The package's own licence (the part before the notices of bundled software)."""
    files = [f for f in (metadata.files(dist) or []) if f.name.upper().startswith("LICENSE")]
    files.sort(key=lambda f: (len(f.parts), str(f)))  # the top-level licence first
    text = files[0].read_text(encoding="utf-8")
    return text.split("\n----", 1)[0].strip() + "\n"


def _numpy_component_licence(suffix: str) -> str:
    files = [f for f in (metadata.files("numpy") or []) if str(f).replace("\\", "/").endswith(suffix)]
    return files[0].read_text(encoding="utf-8") if files else ""


def licence_file_text() -> tuple[str, str, str]:
    """``(LICENSE.txt text, NumPy's copyright line, SciPy's copyright line)``, from the installed packages."""
    numpy_lic, scipy_lic = _licence_text("numpy"), _licence_text("scipy")
    rand = _numpy_component_licence("numpy/random/LICENSE.md")
    rand = rand.split("# 3-Clause BSD License", 1)[-1].split("# Components", 1)[0].replace("**", "").strip()
    ma = _numpy_component_licence("numpy/ma/LICENSE")
    ma = "\n".join(line[2:] if line.startswith("* ") else line.lstrip("*") for line in ma.splitlines()).strip()
    text = ("The documents of this corpus are derived from the docstrings of NumPy and SciPy, which are\n"
            "distributed under the following licences.\n\n"
            "=== NumPy ===\n\n" + numpy_lic
            + "\n=== numpy.random (dual NCSA / 3-Clause BSD licence; the BSD option) ===\n\n" + rand + "\n"
            + "\n=== numpy.ma ===\n\n" + ma + "\n"
            + "\n=== SciPy ===\n\n" + scipy_lic)
    return text, numpy_lic.splitlines()[0], scipy_lic.splitlines()[0]


def build(out_dir: Path) -> corpus.CorpusInfo:
    stop = frozenset(ENGLISH_STOP_WORDS | EXTRA_STOP_WORDS)
    names, texts = collect(stop)
    versions = {"numpy": metadata.version("numpy"), "scipy": metadata.version("scipy"),
                "python": platform.python_version()}
    info = corpus.from_documents(
        texts, out_dir, min_df=MIN_DF, max_df=MAX_DF, max_vocab=MAX_VOCAB, stop_words=stop,
        docs_per_shard=DOCS_PER_SHARD, min_word_len=2, doc_names=names, compress=True,
        source=f"docstrings of the public API of NumPy {versions['numpy']} and SciPy {versions['scipy']} "
               "(tasks/lda/data/build_docstring_corpus.py)",
        extra_meta={"name": NAME, "versions": versions, "licence": "BSD-3-Clause (see LICENSE.txt)",
                    "min_tokens_per_doc": MIN_TOKENS})
    text, numpy_line, scipy_line = licence_file_text()
    (out_dir / "LICENSE.txt").write_text(text, encoding="utf-8")
    _write_readme(out_dir, info, versions, numpy_line, scipy_line)
    return info


def _indent(text: str) -> str:
    return "\n".join(("    " + line).rstrip() for line in text.splitlines())


def _write_readme(out_dir: Path, info: corpus.CorpusInfo, versions: dict, numpy_line: str, scipy_line: str):
    lengths = []
    for shard in corpus.iter_shards(info):
        lengths.extend(corpus.doc_lengths(shard).tolist())
    lengths.sort()
    # the BSD-3-Clause conditions and disclaimer (SciPy's wording: "the copyright holder")
    bsd_body = _licence_text("scipy").split("All rights reserved.", 1)[1].strip()
    median = lengths[len(lengths) // 2]
    readme = f"""# {NAME}: a small real corpus for LDA tests and demos

The docstrings of the public API of NumPy {versions['numpy']} and SciPy {versions['scipy']}
(Python {versions['python']}): one document per public function, class, ufunc, distribution object
and public method of a public class of {len(MODULES)} modules (numpy, numpy.linalg, numpy.random, ...,
scipy.linalg, scipy.sparse, scipy.stats, scipy.signal, scipy.special, scipy.optimize, ...). The
topics are those of the two libraries: linear algebra, statistics and distributions, signal
processing and filters, Fourier transforms, sparse matrices and graphs, optimisation, special
functions, interpolation, integration, image processing, spatial data, polynomials, I/O, strings.

| | |
|---|---|
| documents | {info.n_docs} |
| vocabulary | {info.n_words} words |
| tokens | {int(info.n_tokens)} |
| nonzeros | {info.nnz} |
| words per document | median {int(median)}, max {int(lengths[-1])} |
| shards | {len(info.shard_docs)} of up to {DOCS_PER_SHARD} documents (zlib-compressed .npz) |

Format: `pgmflow-corpus/1` (see `tasks/lda/corpus.py`): `meta.json`, `shard_*.npz`, `vocab.txt`,
plus `doc_names.txt` (the dotted name of each document's object, e.g. `scipy.linalg.svd`). Load it
with `pgmflow.tasks.lda.corpus.open_corpus(pgmflow.tasks.lda.corpus.shipped_corpus_path())`.

How it was built: `tasks/lda/data/build_docstring_corpus.py`. Each docstring loses its Examples,
See Also, References, Methods and "Array API Standard Support" sections, doctest lines, reST roles/directives, URLs and LaTeX
commands; exact duplicates are kept once; documents with fewer than {MIN_TOKENS} words are
skipped; only objects defined by NumPy/SciPy count (attributes inherited from Python's builtins,
whose docstrings are under the PSF licence, are skipped); the BLAS/LAPACK wrappers are left out.
Tokenisation and pruning are those of `from_text_folder`: lower case, words `[a-z][a-z0-9_']*` of
at least 2 characters, the English stop words of `tasks/lda/stopwords.py` plus docstring
boilerplate (`optional`, `default`, `ndarray`, ...), words in at least {MIN_DF} documents and at
most {int(MAX_DF * 100)}% of them, the {MAX_VOCAB} most frequent kept. Rebuilding with other
NumPy/SciPy versions gives a slightly different corpus.

## Licence

The text is derived from NumPy and SciPy and is redistributed under their BSD-3-Clause licences.
The verbatim licence of each package, copied from the installed distributions, is in `LICENSE.txt`.

    Copyright notices:
    {numpy_line}
    Copyright (c) 2019 Kevin Sheppard. All rights reserved. (numpy.random; BSD-3-Clause option
        of its dual NCSA / BSD-3-Clause licence)
    Copyright (c) 2006, University of Georgia and Pierre G.F. Gerard-Marchant (numpy.ma)
    {scipy_line}

{_indent(bsd_body)}
"""
    (out_dir / "README.md").write_text(readme, encoding="utf-8")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else HERE / NAME
    info = build(out.resolve())
    print(f"{info.path}: {info.n_docs} documents, {info.n_words} words, {int(info.n_tokens)} tokens, "
          f"{info.nnz} nonzeros, {len(info.shard_docs)} shards")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
