"""Kernel objects: base kernels, their sums and products, on a subset of input columns (active dims).

A kernel here is an immutable, hashable value (a frozen dataclass) that knows its hyperparameters' layout
and computes its own matrices and hand-written vector-Jacobian products; the values of the
hyperparameters travel beside it as one float64 vector ``theta`` [P] of logarithms (every
hyperparameter is positive), in the order of :meth:`Kernel.param_names`. The chunk statistics of
:mod:`pgmflow.tasks.gp.stats` meet these objects through :mod:`pgmflow.tasks.gp.kernels` (``K``,
``K_vjp``, ``K_sym_vjp``, ``K_diag``, ``K_diag_vjp`` accept a kernel object wherever they accept
``"rbf"``), where ``GPParams.log_lengthscale`` holds ``theta`` and ``GPParams.log_variance`` a global
scale that multiplies the whole kernel.

Base kernels (``x~ = x / ell`` on the active columns, ``u = |x~ - x~'|^2``, ``r = sqrt(u)``;
Rasmussen and Williams 2006, chapter 4)::

    rbf        s exp(-u / 2)                                       variance, lengthscale [D]
    matern12   s exp(-r)                                           variance, lengthscale [D]
    matern32   s (1 + sqrt(3) r) exp(-sqrt(3) r)                   variance, lengthscale [D]
    matern52   s (1 + sqrt(5) r + 5 u / 3) exp(-sqrt(5) r)         variance, lengthscale [D]
    rq         s (1 + u / (2 alpha))^-alpha                        variance, lengthscale [D], alpha
    periodic   s exp(-2 sum_j sin^2(pi (x_j - x'_j) / p) / ell^2)  variance, lengthscale, period
    linear     s x . x'                                            variance
    constant   s                                                   variance
    white      s [x = x'] (s I on K(X, X); 0 on a cross matrix)    variance

``periodic`` is MacKay's (1998) exp-sine-squared kernel in GPflow's form (a sum over the active columns;
in one dimension it is scikit-learn's ``ExpSineSquared``); ``matern12``'s derivative w.r.t. ``u`` is
infinite at ``r = 0``, where its adjoint takes the subgradient 0 (the kernel is not differentiable there).

Adjoints: given ``dK = dL/dK`` [N1, N2], :meth:`Kernel.vjp` returns ``(dL/dtheta [P], dL/dX1 [N1, d] or
None, dL/dX2 [N2, d] or None)``; with ``X2=None`` the matrix is ``K(X, X)`` (exactly symmetric, the
white kernel's ``s I``) and ``dL/dX1`` counts both arguments. A sum passes ``dK`` to every term; a product
passes term ``i`` the adjoint ``dK * prod_{j != i} K_j``. Arrays may be NumPy or CuPy
(``backend.array_module``); ``theta`` is a NumPy vector.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.gp import kernels as kern

__all__ = ["BASE_KINDS", "Base", "Kernel", "Product", "Sum", "base", "parse"]

_SQRT3 = math.sqrt(3.0)
_SQRT5 = math.sqrt(5.0)

# kind -> its hyperparameters (name, one per active dim?) in theta's order
BASE_KINDS: dict[str, tuple[tuple[str, bool], ...]] = {
    "rbf": (("variance", False), ("lengthscale", True)),
    "matern12": (("variance", False), ("lengthscale", True)),
    "matern32": (("variance", False), ("lengthscale", True)),
    "matern52": (("variance", False), ("lengthscale", True)),
    "rq": (("variance", False), ("lengthscale", True), ("alpha", False)),
    "periodic": (("variance", False), ("lengthscale", False), ("period", False)),
    "linear": (("variance", False),),
    "constant": (("variance", False),),
    "white": (("variance", False),),
}
_STATIONARY = ("rbf", "matern12", "matern32", "matern52", "rq")


class Kernel:
    """Common interface; see the module docstring. ``k1 + k2`` and ``k1 * k2`` compose."""

    n_params: int

    def __add__(self, other: Kernel) -> Sum:
        return Sum(_terms(self, Sum) + _terms(other, Sum))

    def __mul__(self, other: Kernel) -> Product:
        return Product(_terms(self, Product) + _terms(other, Product))

    def bases(self) -> tuple[Base, ...]:
        """The base kernels, left to right (their parameters are ``theta`` in this order)."""
        raise NotImplementedError

    def param_names(self) -> list[str]:
        """``name.hyperparameter`` (``[j]`` for one per active dim), in ``theta``'s order."""
        return [f"{b.name}.{p}" for b in self.bases() for p in b.param_names()]

    def K(self, theta, X, X2=None):  # pragma: no cover - interface
        raise NotImplementedError

    def K_diag(self, theta, X):  # pragma: no cover - interface
        raise NotImplementedError

    def vjp(self, theta, X1, X2, dK, wrt_X1: bool = False, wrt_X2: bool = False):  # pragma: no cover
        raise NotImplementedError

    def diag_vjp(self, theta, X, ddiag):  # pragma: no cover - interface
        raise NotImplementedError

    def scale_grad(self, dtheta) -> float:
        """``dL/dlog c`` for a scale ``c`` multiplying the whole kernel, from ``dtheta = dL/dtheta`` (every base
        kernel is proportional to its own variance: a sum adds its terms', a product takes its first factor's)."""
        raise NotImplementedError

    @property
    def spec(self) -> str:
        """The kernel in the grammar of :func:`parse`, which reads it back (given the inputs' width)."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.spec


def _terms(k: Kernel, cls) -> tuple:
    return k.terms if isinstance(k, cls) else (k,)


def _split(theta, parts):
    theta = np.asarray(theta, dtype=np.float64)
    out, i = [], 0
    for p in parts:
        out.append(theta[i : i + p.n_params])
        i += p.n_params
    if i != theta.size:
        raise ValueError(f"theta has {theta.size} entries; the kernel has {i} hyperparameters")
    return out


def _add_opt(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


@dataclass(frozen=True)
class _Composite(Kernel):
    """What a sum and a product share: their terms, whose hyperparameters are theirs in order."""

    terms: tuple

    @property
    def n_params(self) -> int:
        return sum(t.n_params for t in self.terms)

    def bases(self):
        return tuple(b for t in self.terms for b in t.bases())


@dataclass(frozen=True)
class Sum(_Composite):
    """``k = sum_i k_i``."""

    @property
    def spec(self) -> str:
        return " + ".join(t.spec for t in self.terms)

    def K(self, theta, X, X2=None):
        parts = _split(theta, self.terms)
        out = self.terms[0].K(parts[0], X, X2)
        for t, th in zip(self.terms[1:], parts[1:]):
            out = out + t.K(th, X, X2)
        return out

    def K_diag(self, theta, X):
        parts = _split(theta, self.terms)
        out = self.terms[0].K_diag(parts[0], X)
        for t, th in zip(self.terms[1:], parts[1:]):
            out = out + t.K_diag(th, X)
        return out

    def vjp(self, theta, X1, X2, dK, wrt_X1=False, wrt_X2=False):
        dth, dX1, dX2 = [], None, None
        for t, th in zip(self.terms, _split(theta, self.terms)):
            g, a, b = t.vjp(th, X1, X2, dK, wrt_X1, wrt_X2)
            dth.append(g)
            dX1, dX2 = _add_opt(dX1, a), _add_opt(dX2, b)
        return np.concatenate(dth), dX1, dX2

    def diag_vjp(self, theta, X, ddiag):
        return np.concatenate([t.diag_vjp(th, X, ddiag) for t, th in zip(self.terms, _split(theta, self.terms))])

    def scale_grad(self, dtheta) -> float:
        return sum(t.scale_grad(g) for t, g in zip(self.terms, _split(dtheta, self.terms)))


@dataclass(frozen=True)
class Product(_Composite):
    """``k = prod_i k_i`` (elementwise)."""

    @property
    def spec(self) -> str:
        return " * ".join(f"({t.spec})" if isinstance(t, Sum) else t.spec for t in self.terms)

    def K(self, theta, X, X2=None):
        parts = _split(theta, self.terms)
        out = self.terms[0].K(parts[0], X, X2)
        for t, th in zip(self.terms[1:], parts[1:]):
            out = out * t.K(th, X, X2)
        return out

    def K_diag(self, theta, X):
        parts = _split(theta, self.terms)
        out = self.terms[0].K_diag(parts[0], X)
        for t, th in zip(self.terms[1:], parts[1:]):
            out = out * t.K_diag(th, X)
        return out

    def _others(self, mats):
        """``prod_{j != i} mats_j`` for each ``i`` (products of the rest, no division)."""
        out = []
        for i in range(len(mats)):
            acc = None
            for j, M in enumerate(mats):
                if j != i:
                    acc = M if acc is None else acc * M
            out.append(acc)
        return out

    def vjp(self, theta, X1, X2, dK, wrt_X1=False, wrt_X2=False):
        parts = _split(theta, self.terms)
        mats = [t.K(th, X1, X2) for t, th in zip(self.terms, parts)]
        dth, dX1, dX2 = [], None, None
        for t, th, rest in zip(self.terms, parts, self._others(mats)):
            g, a, b = t.vjp(th, X1, X2, dK * rest, wrt_X1, wrt_X2)
            dth.append(g)
            dX1, dX2 = _add_opt(dX1, a), _add_opt(dX2, b)
        return np.concatenate(dth), dX1, dX2

    def diag_vjp(self, theta, X, ddiag):
        parts = _split(theta, self.terms)
        diags = [t.K_diag(th, X) for t, th in zip(self.terms, parts)]
        return np.concatenate(
            [t.diag_vjp(th, X, ddiag * rest) for t, th, rest in zip(self.terms, parts, self._others(diags))]
        )

    def scale_grad(self, dtheta) -> float:
        return self.terms[0].scale_grad(_split(dtheta, self.terms)[0])


@dataclass(frozen=True)
class Base(Kernel):
    """One base kernel ``kind`` on the input columns ``dims`` of inputs with ``d`` columns; ``name`` is its
    label in the config (``sparse_gp.kernel_params.<name>``)."""

    kind: str
    name: str
    dims: tuple
    d: int

    def __post_init__(self):
        if self.kind not in BASE_KINDS:
            raise ValueError(f"unknown kernel {self.kind!r}; expected one of {', '.join(BASE_KINDS)}")
        if not self.dims or any(not 0 <= j < self.d for j in self.dims):
            raise ValueError(f"active dims {list(self.dims)} out of range for {self.d} input column(s)")

    @property
    def n_params(self) -> int:
        return sum(len(self.dims) if per_dim else 1 for _, per_dim in BASE_KINDS[self.kind])

    def bases(self):
        return (self,)

    def scale_grad(self, dtheta) -> float:
        return float(np.asarray(dtheta)[0])  # its variance's: the kernel is proportional to it

    def param_names(self) -> list[str]:
        out = []
        for p, per_dim in BASE_KINDS[self.kind]:
            out += [f"{p}[{j}]" for j in range(len(self.dims))] if per_dim else [p]
        return out

    @property
    def spec(self) -> str:
        dims = "" if self.dims == tuple(range(self.d)) else "[" + ",".join(str(j) for j in self.dims) + "]"
        label = "" if self.name == self.kind else f"{self.name}:"
        return f"{label}{self.kind}{dims}"

    # -- helpers ---------------------------------------------------------------------------------------

    def _cols(self, xp, X):
        X = xp.asarray(X, dtype=xp.float64)
        if X.ndim != 2 or X.shape[1] != self.d:
            raise ValueError(f"kernel {self.spec!r} takes inputs [N, {self.d}]; got shape {X.shape}")
        return X if self.dims == tuple(range(self.d)) else X[:, list(self.dims)]

    def _scatter(self, xp, G):
        """``G`` [N, D] on the active columns -> [N, d] with zeros elsewhere."""
        if self.dims == tuple(range(self.d)):
            return G
        out = xp.zeros((G.shape[0], self.d), dtype=xp.float64)
        out[:, list(self.dims)] = G
        return out

    def _stationary(self, xp, theta, X1, X2):
        """``(s, ls [D], x~1, x~2, u)``; ``X2=None``: ``u`` of ``X1`` with itself, exactly symmetric."""
        D = len(self.dims)
        s = math.exp(float(theta[0]))
        ls = xp.exp(xp.asarray(theta[1 : 1 + D], dtype=xp.float64))
        X1s = self._cols(xp, X1) / ls
        X2s = X1s if X2 is None else self._cols(xp, X2) / ls
        return s, ls, X1s, X2s, kern._sqdist(xp, X1s, X2s, symmetric=X2 is None)

    def _profile(self, xp, theta, U, s):
        """``(K, dK/du, dK/dlog alpha or None)`` from squared scaled distances ``U``."""
        kind = self.kind
        if kind == "rbf":
            Kmat = s * xp.exp(-0.5 * U)
            return Kmat, -0.5 * Kmat, None
        if kind == "matern12":
            r = xp.sqrt(U)
            e = s * xp.exp(-r)
            safe = xp.where(r > 0, r, 1.0)
            return e, xp.where(r > 0, -0.5 * e / safe, 0.0), None
        if kind == "matern32":
            r = xp.sqrt(3.0 * U)
            e = xp.exp(-r)
            return s * (1.0 + r) * e, (-1.5 * s) * e, None
        if kind == "matern52":
            r = xp.sqrt(5.0 * U)
            e = xp.exp(-r)
            return s * (1.0 + r + r * r / 3.0) * e, (-5.0 / 6.0 * s) * (1.0 + r) * e, None
        alpha = math.exp(float(theta[-1]))  # rq
        base = 1.0 + U / (2.0 * alpha)
        log_base = xp.log(base)
        Kmat = s * xp.exp(-alpha * log_base)
        dKdu = -0.5 * Kmat / base
        dKdlog_alpha = alpha * Kmat * ((U / (2.0 * alpha)) / base - log_base)
        return Kmat, dKdu, dKdlog_alpha

    def _periodic_parts(self, xp, theta, X1, X2):
        s, ell, p = (math.exp(float(t)) for t in theta[:3])
        A = self._cols(xp, X1)
        B = A if X2 is None else self._cols(xp, X2)
        Dlt = A[:, None, :] - B[None, :, :]  # [N1, N2, D]
        S = xp.sum(xp.sin((math.pi / p) * Dlt) ** 2, axis=2)  # [N1, N2]
        return s, ell, p, Dlt, S, s * xp.exp((-2.0 / ell**2) * S)

    # -- values ------------------------------------------------------------------------------------------

    def K(self, theta, X, X2=None):
        xp = backend.array_module(X)
        theta = np.asarray(theta, dtype=np.float64)
        s = math.exp(float(theta[0]))
        kind = self.kind
        if kind in _STATIONARY:
            s, _, _, _, U = self._stationary(xp, theta, X, X2)
            return self._profile(xp, theta, U, s)[0]
        if kind == "periodic":
            return self._periodic_parts(xp, theta, X, X2)[-1]
        n1 = int(X.shape[0])
        n2 = n1 if X2 is None else int(X2.shape[0])
        if kind == "linear":
            A = self._cols(xp, X)
            B = A if X2 is None else self._cols(xp, X2)
            return s * (A @ B.T)
        if kind == "constant":
            return xp.full((n1, n2), s, dtype=xp.float64)
        out = xp.zeros((n1, n2), dtype=xp.float64)  # white
        if X2 is None:
            out[xp.arange(n1), xp.arange(n1)] = s
        return out

    def K_diag(self, theta, X):
        xp = backend.array_module(X)
        s = math.exp(float(np.asarray(theta, dtype=np.float64)[0]))
        if self.kind == "linear":
            A = self._cols(xp, X)
            return s * xp.sum(A * A, axis=1)
        return xp.full(int(X.shape[0]), s, dtype=xp.float64)

    # -- adjoints ----------------------------------------------------------------------------------------

    def vjp(self, theta, X1, X2, dK, wrt_X1=False, wrt_X2=False):
        """``(dtheta [P], dX1 [N1, d] or None, dX2 [N2, d] or None)``; ``X2=None``: ``K(X1, X1)``, and
        ``dX1`` through both arguments (``dX2`` None)."""
        xp = backend.array_module(X1)
        theta = np.asarray(theta, dtype=np.float64)
        dK = xp.asarray(dK, dtype=xp.float64)
        sym = X2 is None
        wrt_X2 = wrt_X2 and not sym
        kind = self.kind
        dth = np.zeros(self.n_params)
        dX1 = dX2 = None
        if kind in _STATIONARY:
            s, ls, X1s, X2s, U = self._stationary(xp, theta, X1, X2)
            Kmat, dKdu, dKda = self._profile(xp, theta, U, s)
            D = len(self.dims)
            dth[0] = float(xp.sum(dK * Kmat))
            G = dK * dKdu
            if sym and wrt_X1:
                dls, _, _ = kern._vjp_core(xp, ls, X1s, X2s, G, False, False)
                Gs = G + G.T
                dX1 = (2.0 / ls) * (Gs.sum(axis=1)[:, None] * X1s - Gs @ X1s)
            else:
                dls, dX1, dX2 = kern._vjp_core(xp, ls, X1s, X2s, G, wrt_X1, wrt_X2)
            dth[1 : 1 + D] = backend.to_numpy(dls)
            if dKda is not None:
                dth[-1] = float(xp.sum(dK * dKda))
        elif kind == "periodic":
            s, ell, p, Dlt, S, Kmat = self._periodic_parts(xp, theta, X1, X2)
            W = dK * Kmat  # [N1, N2]
            sin2 = xp.sin((2.0 * math.pi / p) * Dlt)  # [N1, N2, D]  d sin^2(pi D / p) / dD = (pi / p) sin(2 pi D / p)
            dth[0] = float(xp.sum(W))
            dth[1] = float(xp.sum(W * S)) * 4.0 / ell**2
            dS_dlogp = -(math.pi / p) * xp.sum(sin2 * Dlt, axis=2)  # [N1, N2]
            dth[2] = float(xp.sum(W * dS_dlogp)) * (-2.0 / ell**2)
            if wrt_X1 or wrt_X2:
                Gd = (W * (-2.0 / ell**2) * (math.pi / p))[:, :, None] * sin2  # [N1, N2, D]  dL/dD
                if wrt_X1:
                    dX1 = Gd.sum(axis=1) - (Gd.sum(axis=0) if sym else 0.0)
                if wrt_X2:
                    dX2 = -Gd.sum(axis=0)
        elif kind == "linear":
            s = math.exp(float(theta[0]))
            A = self._cols(xp, X1)
            B = A if sym else self._cols(xp, X2)
            dth[0] = float(xp.sum(dK * (s * (A @ B.T))))
            if wrt_X1:
                dX1 = s * ((dK + dK.T) @ A if sym else dK @ B)
            if wrt_X2:
                dX2 = s * (dK.T @ A)
        elif kind == "constant":
            dth[0] = math.exp(float(theta[0])) * float(xp.sum(dK))
        else:  # white: s I on K(X, X), zero on a cross matrix
            dth[0] = math.exp(float(theta[0])) * float(xp.trace(dK)) if sym else 0.0
        n1 = int(X1.shape[0])
        if wrt_X1:
            dX1 = xp.zeros((n1, self.d)) if dX1 is None else self._scatter(xp, dX1)
        if wrt_X2:
            dX2 = xp.zeros((int(X2.shape[0]), self.d)) if dX2 is None else self._scatter(xp, dX2)
        return dth, dX1, dX2

    def diag_vjp(self, theta, X, ddiag):
        """``dL/dtheta`` [P] given ``ddiag = dL/dK_diag(X)`` [N] (or a scalar for every row)."""
        xp = backend.array_module(X)
        dth = np.zeros(self.n_params)
        diag = self.K_diag(theta, X)
        dth[0] = float(xp.sum(diag * ddiag))  # every base kernel's diagonal is proportional to s
        return dth


def base(kind: str, d: int, dims=None, name: str | None = None) -> Base:
    """A :class:`Base` kernel on columns ``dims`` (None: all ``d``), labelled ``name`` (default: ``kind``)."""
    return Base(kind, name or kind, tuple(range(d)) if dims is None else tuple(int(j) for j in dims), int(d))


# ------------------------------------------------------------------------------------------------------------
# The string grammar
# ------------------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[-+*:,()\[\]])|(?P<bad>\S))")


def parse(text: str, d: int) -> Kernel:
    """A kernel from the grammar (``*`` binds tighter than ``+``; parentheses group)::

        expr   := term ('+' term)*
        term   := factor ('*' factor)*
        factor := [label ':'] kind ['[' dim (',' dim)* ']'] | '(' expr ')'

    ``kind`` is one of :data:`BASE_KINDS`; ``dim`` a 0-based input column of the ``d`` columns (default: all).
    A base kernel's name (its key in ``sparse_gp.kernel_params``) is its label, or its kind, numbered from the
    second of the same kind on (``rbf``, ``rbf2``, ...). ValueError, in one line, on anything malformed."""
    toks = []
    for m in _TOKEN.finditer(str(text)):
        if m.group("bad"):
            raise ValueError(f"unexpected character {m.group('bad')!r}")
        toks.append(next((k, v) for k, v in m.groupdict().items() if v is not None))
    pos = [0]
    seen: dict[str, int] = {}
    names: set[str] = set()

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else (None, None)

    def take(kind=None, value=None, what=""):
        k, v = peek()
        if k is None or (kind and k != kind) or (value and v != value):
            where = f"{v!r}" if k is not None else "the end"
            raise ValueError(f"expected {what or value or kind} but found {where}")
        pos[0] += 1
        return v

    def factor():
        k, v = peek()
        if (k, v) == ("op", "("):
            take()
            e = expr()
            take("op", ")", "')'")
            return e
        if k != "name":
            if (k, v) in (("op", "*"), ("op", "+")):
                raise ValueError(f"'{v}' needs a kernel on both sides")
            raise ValueError(f"expected a kernel but found {v!r}" if k else "expected a kernel but found the end")
        word = take()
        label = None
        if peek() == ("op", ":"):
            take()
            label, word = word, take("name", what="a kernel after the label")
        if word not in BASE_KINDS:
            raise ValueError(f"unknown kernel {word!r}; expected one of {', '.join(BASE_KINDS)}")
        dims = None
        if peek() == ("op", "["):
            take()
            dims = [int(take("num", what="an input column"))]
            while peek() == ("op", ","):
                take()
                dims.append(int(take("num", what="an input column")))
            take("op", "]", "']'")
            bad = [j for j in dims if not 0 <= j < d]
            if bad or len(set(dims)) != len(dims):
                raise ValueError(
                    f"active dims {dims} of {word!r} out of range (or repeated): "
                    f"the data has {d} input column(s), 0..{d - 1}"
                )
        seen[word] = seen.get(word, 0) + 1
        name = label or (word if seen[word] == 1 else f"{word}{seen[word]}")
        if name in names:
            raise ValueError(f"two kernels are named {name!r}; give each a label (label:kind)")
        names.add(name)
        return base(word, d, dims, name)

    def term():
        k = factor()
        while peek() == ("op", "*"):
            take()
            if peek()[0] is None or peek() in (("op", "+"), ("op", ")")):
                raise ValueError("'*' needs a kernel on both sides")
            k = k * factor()
        return k

    def expr():
        k = term()
        while peek() == ("op", "+"):
            take()
            if peek()[0] is None or peek() in (("op", "*"), ("op", ")")):
                raise ValueError("'+' needs a kernel on both sides")
            k = k + term()
        return k

    if not toks:
        raise ValueError("is empty")
    k = expr()
    if pos[0] != len(toks):
        raise ValueError(f"unexpected {peek()[1]!r} after a complete kernel")
    return k
