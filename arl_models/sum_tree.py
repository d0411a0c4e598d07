"""A compiled K-ary sum tree with minima: the index that prioritised replay draws from.

Levels of fan-out ``K`` (default 16) in one flat float64 array, and the minima in another: level 0 holds
the leaves, each entry above is the sum of its ``K`` children, up to the first level of at most 4,096
nodes (3,920 for a million items), whose running sums every draw recomputes. The hot paths are numba
kernels (``njit(cache=True, nogil=True)``): ``B`` ascending draws walk the top level once and then descend
level by level, loading all ``B`` blocks of a level before scanning any, so that their cache misses overlap
(two levels below the top for a million items), and with them the blocks of minima that the priority
write-back after a draw recomputes; a priority update writes the leaves and recomputes only the touched
ancestors, level by level; the importance-sampling weights are computed in the same call as the draws.
Every inner node is always recomputed from its children by the same reduction (four interleaved running
sums over the children, then their pairwise sum: see ``_recompute``), so a tree rebuilt from its leaves
(after loading a checkpoint) equals the incrementally updated one bit for bit.

The kernels stay plain Python functions until the first :class:`SumTree` is built (importing this module
does not import numba); the first call of each compiles it, once per source version: numba caches the
machine code beside the module (or in ``NUMBA_CACHE_DIR``). Throughput against TorchRL's segment trees:
benchmarks/README.md, "Prioritised replay".
"""

from __future__ import annotations

import threading

import numpy as np

# ---- the compiled kernels ----------------------------------------------------------------------------
# Plain functions over the tree's flat arrays; :func:`_compile` makes them numba functions when the first
# SumTree is built (importing this module does not import numba). Level ``d`` of the sums is
# ``sums[off[d]:off[d + 1]]`` (level 0: the leaves); level ``d >= 1`` of the minima is
# ``mins[off[d] - off[1]:off[d + 1] - off[1]]``; ``mins`` is empty without min tracking. The loops index
# the flat arrays directly: a slice per block costs more than the block's arithmetic.


def _recompute(sums: np.ndarray, mins: np.ndarray, off: np.ndarray, k: int, d: int, m: int) -> None:
    """Node ``m`` of level ``d`` from its ``k`` children (inlined into the callers).

    The sum is always formed in one order: four running sums over the children ``c = q (mod 4)``, the
    ``k mod 4`` last children added to the first, then ``(s0 + s1) + (s2 + s3)``; four short chains of
    additions instead of one of ``k``.
    """
    base = off[d - 1] + m * k
    s0 = s1 = s2 = s3 = 0.0
    l0 = l1 = np.inf
    c = 0
    if d == 1 or mins.size == 0:  # a leaf of 0 is empty or has underflowed: never drawn, so not the minimum
        while c + 4 <= k:
            v0, v1, v2, v3 = sums[base + c], sums[base + c + 1], sums[base + c + 2], sums[base + c + 3]
            s0, s1, s2, s3 = s0 + v0, s1 + v1, s2 + v2, s3 + v3
            l0 = v0 if (v0 != 0.0) & (v0 < l0) else l0
            l1 = v1 if (v1 != 0.0) & (v1 < l1) else l1
            l0 = v2 if (v2 != 0.0) & (v2 < l0) else l0
            l1 = v3 if (v3 != 0.0) & (v3 < l1) else l1
            c += 4
        while c < k:
            v0 = sums[base + c]
            s0 += v0
            l0 = v0 if (v0 != 0.0) & (v0 < l0) else l0
            c += 1
    else:
        mb = base - off[1]
        while c + 4 <= k:
            s0, s1 = s0 + sums[base + c], s1 + sums[base + c + 1]
            s2, s3 = s2 + sums[base + c + 2], s3 + sums[base + c + 3]
            v0, v1, v2, v3 = mins[mb + c], mins[mb + c + 1], mins[mb + c + 2], mins[mb + c + 3]
            l0 = v0 if v0 < l0 else l0
            l1 = v1 if v1 < l1 else l1
            l0 = v2 if v2 < l0 else l0
            l1 = v3 if v3 < l1 else l1
            c += 4
        while c < k:
            s0 += sums[base + c]
            l0 = mins[mb + c] if mins[mb + c] < l0 else l0
            c += 1
    sums[off[d] + m] = (s0 + s1) + (s2 + s3)
    if mins.size:
        mins[off[d] - off[1] + m] = l0 if l0 < l1 else l1


def _tree_update(
    sums: np.ndarray, mins: np.ndarray, off: np.ndarray, k: int, cap: int, idx: np.ndarray, values: np.ndarray
) -> None:
    for i in range(idx.size):
        if idx[i] < 0 or idx[i] >= cap:
            raise IndexError("SumTree.update: index out of range")
        sums[idx[i]] = 0.0
    for i in range(idx.size):  # of duplicate indices the largest value wins (as np.maximum: NaN too)
        v = values[i]
        if v > sums[idx[i]] or v != v:
            sums[idx[i]] = v
    sh = 0
    while (1 << sh) < k:
        sh += 1
    pow2 = (1 << sh) == k  # parents by shifts then: a 64-bit division costs tens of cycles
    node, touch = idx.copy(), 0.0
    for d in range(1, off.size - 1):  # level by level: a parent after all its changed children
        for i in range(node.size):
            node[i] = node[i] >> sh if pow2 else node[i] // k
        if (
            mins.size
        ):  # first load the blocks of minima this level writes (and the next reads): overlapped misses
            o = off[d] - off[1]
            for i in range(node.size):
                m = node[i] & -k if pow2 else node[i] // k * k
                touch += mins[o + m] + mins[o + m + k - 1]
        prev = -1
        for i in range(node.size):
            if node[i] != prev:  # a parent shared with the previous index (sorted draws) once
                _recompute(sums, mins, off, k, d, node[i])
                prev = node[i]
    sums[off[-1]] = touch  # the sink: the loads above stay


def _tree_rebuild(sums: np.ndarray, mins: np.ndarray, off: np.ndarray, k: int) -> None:
    for d in range(1, off.size - 1):
        for m in range((off[d] - off[d - 1]) // k):
            _recompute(sums, mins, off, k, d, m)


def _tree_total(sums: np.ndarray, off: np.ndarray) -> float:
    s = 0.0
    for v in sums[off[-2] : off[-1]]:  # in order, as the running sums of a draw
        s += v
    return s


def _tree_min(sums: np.ndarray, mins: np.ndarray, off: np.ndarray) -> float:
    if off.size == 2:  # the leaves are the top
        low = np.inf
        for v in sums[: off[1]]:
            low = v if (v != 0.0) & (v < low) else low
        return low
    top = mins[off[-2] - off[1] : off[-1] - off[1]]
    l0 = l1 = l2 = l3 = np.inf  # four running minima (the top holds a multiple of k entries)
    for j in range(0, top.size - 3, 4):
        l0 = top[j] if top[j] < l0 else l0
        l1 = top[j + 1] if top[j + 1] < l1 else l1
        l2 = top[j + 2] if top[j + 2] < l2 else l2
        l3 = top[j + 3] if top[j + 3] < l3 else l3
    for j in range(top.size - top.size % 4, top.size):
        l0 = top[j] if top[j] < l0 else l0
    return min(min(l0, l1), min(l2, l3))


def _top_node(prefix: np.ndarray, sums: np.ndarray, top: int, t: int, x: float, lo: int, walk: bool) -> int:
    """The first top node ending after ``x``: a walk on from ``lo`` (ascending draws), else a search."""
    if walk:
        while lo < t - 1 and prefix[lo + 1] <= x:
            lo += 1
    else:
        lo, n = 0, t
        while n > 1:
            half = n >> 1
            lo = lo + half if prefix[lo + half] <= x else lo
            n -= half
    if prefix[lo + 1] <= x:  # u rounded onto the total: the last non-empty node
        lo = t - 1
        while lo > 0 and sums[top + lo] == 0.0:
            lo -= 1
    return lo


def _tree_draw(
    sums: np.ndarray, mins: np.ndarray, off: np.ndarray, k: int, r: np.ndarray, prefix: np.ndarray
) -> np.ndarray:
    top, t = off[-2], off[-1] - off[-2]
    prefix[0] = 0.0
    for j in range(t):  # the top level's running sums (prefix[t] is the total)
        prefix[j + 1] = prefix[j] + sums[top + j]
    node = np.empty(r.size, np.int64)
    u = np.empty(r.size)
    lo = 0
    for b in range(r.size):
        x = r[b] * prefix[t]
        lo = _top_node(prefix, sums, top, t, x, lo, b > 0 and r[b] >= r[b - 1])
        node[b], u[b] = lo, x - prefix[lo]
    for d in range(off.size - 3, -1, -1):  # level by level
        o = off[d]
        touch = 0.0
        for b in range(r.size):  # first load every block of the level: the cache misses overlap
            touch += sums[o + node[b] * k] + sums[o + node[b] * k + k - 1]
        if d >= 1 and mins.size:  # and their minima, which the priority write-back after a draw reads
            mo = o - off[1]
            for b in range(r.size):
                touch += mins[mo + node[b] * k] + mins[mo + node[b] * k + k - 1]
        sums[off[-1]] = touch  # the sink: the loads above stay
        for b in range(r.size):
            base, x = o + node[b] * k, u[b]
            acc, before, j = 0.0, 0.0, 0
            for c in range(k):  # j children end at or before u: child j is the first ending after it
                acc += sums[base + c]
                le = acc <= x
                j += le
                before = acc if le else before
            if j == k:  # rounding put u past the children's sum: the last non-empty child
                j = k - 1
                while j > 0 and sums[base + j] == 0.0:
                    j -= 1
                before = 0.0
                for c in range(j):
                    before += sums[base + c]
            u[b] = x - before
            node[b] = node[b] * k + j
    return node


def _leaf_values(p: np.ndarray, c: np.ndarray, alpha: float, freshness: float, ref: int) -> np.ndarray:
    """``p^alpha * exp(freshness * (c - c_ref))`` (``c`` is not read when ``freshness`` is 0)."""
    v = np.empty(p.size)
    for i in range(p.size):
        v[i] = p[i] ** alpha
        if freshness != 0.0:
            v[i] *= np.exp(freshness * (c[i] - ref))
    return v


def _sample(
    sums: np.ndarray,
    mins: np.ndarray,
    off: np.ndarray,
    k: int,
    r: np.ndarray,
    prefix: np.ndarray,
    n: int,
    beta: float,
    batch_min: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Slots for the uniforms ``r`` (clipped to the ``n`` filled) and their IS weights."""
    idx = _tree_draw(sums, mins, off, k, r, prefix)
    low = np.inf if batch_min else _tree_min(sums, mins, off)
    for b in range(idx.size):
        idx[b] = min(idx[b], n - 1)
        if batch_min:
            low = min(low, sums[idx[b]])
    w = np.empty(idx.size, np.float32)
    for b in range(idx.size):
        w[b] = (sums[idx[b]] / low) ** -beta  # (P_i / P_min)^-beta
    return idx, w


def _set_priorities(
    sums: np.ndarray,
    mins: np.ndarray,
    off: np.ndarray,
    k: int,
    cap: int,
    idx: np.ndarray,
    td: np.ndarray,
    eps: float,
    alpha: float,
    freshness: float,
    ref: int,
    inserted: np.ndarray,
) -> float:
    """Leaves ``idx`` from ``p = |td| + eps``; returns the largest ``p``."""
    p = np.empty(idx.size)
    c = np.zeros(idx.size, np.int64)
    for i in range(idx.size):
        if idx[i] < 0 or idx[i] >= cap:
            raise IndexError("update_priorities: slot out of range")
        p[i] = abs(td[i]) + eps
        if freshness != 0.0:
            c[i] = inserted[idx[i]]
    _tree_update(sums, mins, off, k, cap, idx, _leaf_values(p, c, alpha, freshness, ref))
    return p.max()


_KERNELS = (
    "_recompute",
    "_tree_update",
    "_tree_rebuild",
    "_tree_total",
    "_tree_min",
    "_top_node",
    "_tree_draw",
    "_leaf_values",
    "_sample",
    "_set_priorities",
)  # callees before their callers
_INLINED = ("_recompute", "_top_node")  # into their callers, at numba's level: no call per node
_compiled = False
_compile_lock = threading.Lock()


def _compile() -> None:
    """Replace the kernels above by numba functions (compiled on first call, cached on disk)."""
    global _compiled
    with _compile_lock:
        if _compiled:
            return
        from numba import njit

        g = globals()
        for name in _KERNELS:
            g[name] = njit(cache=True, nogil=True, inline="always" if name in _INLINED else "never")(g[name])
        _compiled = True


class SumTree:
    """Sums (and optionally minima) over ``capacity`` non-negative leaves: ``K`` children per node, and
    a flat top.

    ``sums[0]`` holds the leaves (padded to a multiple of ``K``) and ``sums[d + 1][m]`` the sum of
    ``sums[d][m * K : (m + 1) * K]``, up to the first level with at most ``top`` nodes; above it one
    running sum over that level per draw (a few thousand additions) stands in for the upper part of the
    tree. ``mins[d]`` holds the minima of level ``d + 1`` over the positive leaves below it (a leaf of 0
    is empty or has underflowed: it is never drawn, so it is not the minimum either). A node's children
    are always summed in one fixed order (``_recompute``), whatever the batch, so its value never depends
    on the history of updates. The levels are views of one flat array each (``_sums``, ``_mins``), which
    the compiled kernels walk; write leaves through ``sums[0]`` and call :meth:`rebuild`, or use
    :meth:`update`.
    """

    def __init__(self, capacity: int, fanout: int = 16, track_min: bool = True, top: int = 4096):
        if capacity < 1 or fanout < 2 or top < 1:
            raise ValueError("SumTree: need capacity >= 1, fanout >= 2 and top >= 1")
        _compile()
        self.capacity, self.k = capacity, fanout
        sizes, n = [], capacity
        while True:
            sizes.append(-(-n // fanout) * fanout)
            if n <= top:
                break
            n = -(-n // fanout)
        self._off = np.cumsum([0, *sizes]).astype(np.int64)
        buf = np.zeros(self._off[-1] + 17)
        shift = (-buf.ctypes.data // 8) % 16  # blocks of 16 children on 128-byte boundaries: two cache lines
        self._sums = buf[shift : shift + self._off[-1] + 1]  # and a last entry, a sink for prefetching loads
        self._mins = np.full(self._off[-1] - self._off[1] if track_min else 0, np.inf)
        self.sums = [self._sums[a:b] for a, b in zip(self._off[:-1], self._off[1:], strict=True)]
        self.mins = (
            [
                self._mins[a - self._off[1] : b - self._off[1]]
                for a, b in zip(self._off[1:-1], self._off[2:], strict=True)
            ]
            if track_min
            else None
        )
        self._prefix = np.zeros(sizes[-1] + 1)  # 0, then the top level's running sums

    def total(self) -> float:
        return float(_tree_total(self._sums, self._off))

    def min(self) -> float:
        """The smallest positive leaf (``inf`` when none is)."""
        assert self.mins is not None, "SumTree built without track_min"
        return float(_tree_min(self._sums, self._mins, self._off))

    @property
    def leaves(self) -> np.ndarray:
        return self.sums[0][: self.capacity]

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` to ``values`` (``>= 0``; of duplicate indices the largest value wins) and
        recompute their ancestors, level by level."""
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        values = np.ascontiguousarray(values, dtype=np.float64)
        if idx.shape != values.shape or idx.ndim != 1:
            raise ValueError("SumTree.update: idx and values must be 1-d and of one length")
        _tree_update(self._sums, self._mins, self._off, self.k, self.capacity, idx, values)

    def rebuild(self) -> None:
        """Recompute every inner node from the leaves (the same reduction as :meth:`update`)."""
        _tree_rebuild(self._sums, self._mins, self._off, self.k)

    def draw(self, r: np.ndarray) -> np.ndarray:
        """The leaf of each prefix sum ``u = r * total`` (``r`` in ``[0, 1)``, ``(B,)``): the ``i`` with
        ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])``, for all ``B`` in one compiled descent."""
        r = np.ascontiguousarray(r, dtype=np.float64)
        return _tree_draw(self._sums, self._mins, self._off, self.k, r, self._prefix)

    def sample(self, r: np.ndarray, n: int, beta: float, batch_min: bool) -> tuple[np.ndarray, np.ndarray]:
        """The leaves drawn for the sorted uniforms ``r`` (clipped to the ``n`` filled) and their
        importance-sampling weights ``(leaf / min_leaf)^-beta``, the minimum over the tree or, with
        ``batch_min``, over the draws: ``(idx int64 (B,), w float32 (B,))``."""
        return _sample(self._sums, self._mins, self._off, self.k, r, self._prefix, n, beta, batch_min)

    def set_priorities(
        self,
        idx: np.ndarray,
        td: np.ndarray,
        eps: float,
        alpha: float,
        freshness: float,
        ref: int,
        inserted: np.ndarray,
    ) -> float:
        """Leaves ``idx`` from priorities ``p = |td| + eps``: ``p^alpha * exp(freshness * (c - ref))``
        with ``c = inserted[idx]``; returns the largest ``p``."""
        tree = (self._sums, self._mins, self._off, self.k, self.capacity)
        return float(_set_priorities(*tree, idx, td, eps, alpha, freshness, ref, inserted))


def leaf_values(p: np.ndarray, c: np.ndarray, alpha: float, freshness: float, ref: int) -> np.ndarray:
    """``p^alpha * exp(freshness * (c - ref))`` for priorities ``p`` and insertion counters ``c``."""
    _compile()
    return _leaf_values(
        np.ascontiguousarray(p, dtype=np.float64),
        np.ascontiguousarray(c, dtype=np.int64),
        alpha,
        freshness,
        ref,
    )
