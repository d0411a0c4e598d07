"""Prioritised replay with freshness: the sampling distribution, IS weights, freshness, duplicate updates,
checkpoints, the algorithms' weighted TD loss, and fine-tuning / offline CQL runs that resume exactly."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy import stats

from arl_models.algos.calql import CalQL, CalQLConfig, MCBatch
from arl_models.algos.cql import CQL, CQLConfig
from arl_models.algos.sac import SAC, SACConfig
from arl_models.online import FinetuneConfig, finetune, sample_mixed_prioritized
from arl_models.prioritized import PERConfig, PrioritizedReplay, SumTree, half_life_freshness
from arl_models.replay import ReplayBuffer
from tests.online.conftest import TINY_CQL, write_pendulum_data

OBS, ACT = 3, 1


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    """``n`` transitions whose ``rew`` is their global insertion number (to recognise them)."""
    r = np.arange(start, start + n, dtype=np.float32)
    z = np.zeros(n, np.float32)
    return dict(
        obs=np.tile(r[:, None], (1, OBS)),
        act=np.zeros((n, ACT), np.float32),
        rew=r,
        cost=z,
        next_obs=np.zeros((n, OBS), np.float32),
        done=z,
    )


def filled(
    n: int, cfg: PERConfig, capacity: int = 100_000, td: np.ndarray | None = None
) -> PrioritizedReplay:
    per = PrioritizedReplay(capacity, OBS, ACT, cfg)
    per.add(**rows(n))
    if td is not None:
        per.update_priorities(torch.arange(n), torch.as_tensor(td))
    return per


def chi_square_pvalue(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    return float(stats.chisquare(counts, expected).pvalue)


def draw_counts(per: PrioritizedReplay, n_items: int, draws: int, batch: int = 1000) -> np.ndarray:
    counts = np.zeros(n_items)
    for _ in range(draws // batch):
        idx, _ = per.sample_indices(batch)
        counts += np.bincount(idx.numpy(), minlength=n_items)
    return counts


# ---- the sampling distribution ----------------------------------------------------------------------
@pytest.mark.parametrize("fanout", [2, 16])
def test_sampling_frequencies_match_priorities(fanout):
    n = 60
    td = np.random.default_rng(1).exponential(size=n) * np.r_[np.ones(n - 5), [20.0] * 5]  # heavy items too
    cfg = PERConfig(alpha=0.7, fanout=fanout, seed=3)
    per = filled(n, cfg, td=td)
    p = (np.abs(td) + cfg.eps) ** cfg.alpha
    p /= p.sum()
    np.testing.assert_allclose(per.probabilities().numpy(), p, rtol=1e-12)
    counts = draw_counts(per, n, 200_000)
    assert chi_square_pvalue(counts, p) > 1e-3
    # the test has power: the same draws reject the uniform distribution and the un-powered priorities
    assert chi_square_pvalue(counts, np.full(n, 1.0 / n)) < 1e-12
    q = np.abs(td) / np.abs(td).sum()
    assert chi_square_pvalue(counts, q) < 1e-12


@pytest.mark.parametrize("fanout,top", [(2, 1), (3, 2), (16, 4096)])
def test_tree_draw_is_the_inverse_cdf(fanout, top):
    rng = np.random.default_rng(0)
    leaves = rng.exponential(size=1000) * (rng.uniform(size=1000) < 0.8)  # zeros in between
    tree = SumTree(1000, fanout, top=top)
    tree.update(np.arange(1000), leaves)
    ends = np.cumsum(leaves)
    r = rng.uniform(size=5000)
    expected = np.searchsorted(ends, r * ends[-1], side="right")
    got = tree.draw(r)
    # exact up to float rounding at the boundaries (none among these draws)
    assert (got == expected).mean() == 1.0
    assert (leaves[got] > 0).all()
    assert tree.total() == pytest.approx(leaves.sum(), rel=1e-12)
    assert tree.min() == leaves[leaves > 0].min()


def test_tree_update_recomputes_ancestors_like_a_rebuild():
    """After random batch updates (with duplicates) every level equals a rebuild from the leaves, bit for
    bit: so a tree restored from its leaves (a checkpoint) continues exactly."""
    rng = np.random.default_rng(0)
    tree = SumTree(1000, 4, top=8)
    for _ in range(50):
        idx = rng.integers(0, 1000, size=int(rng.integers(1, 300)))
        tree.update(idx, rng.exponential(size=len(idx)))
        fresh = SumTree(1000, 4, top=8)
        fresh.sums[0][:] = tree.sums[0]
        fresh.rebuild()
        for a, b in zip(tree.sums + tree.mins, fresh.sums + fresh.mins, strict=True):
            assert np.array_equal(a, b)
    assert [len(x) for x in tree.sums] == [1000, 252, 64, 16, 4]  # padded to K; the top has <= 8 nodes


def reference_sum(ch: np.ndarray) -> np.ndarray:
    """The kernels' reduction of children ``(k, n)``, vectorised over ``n``: four running sums over the
    children ``c = q (mod 4)``, the ``k mod 4`` last children added to the first, then
    ``(s0 + s1) + (s2 + s3)``."""
    k = len(ch)
    lanes = [np.zeros(ch.shape[1]) for _ in range(4)]
    for c in range(k - k % 4):
        lanes[c % 4] += ch[c]
    for c in range(k - k % 4, k):
        lanes[0] += ch[c]
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


def reference_levels(leaves: np.ndarray, k: int, top: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The tree's levels by plain numpy, a level at a time: each node the reduction of its children
    (:func:`reference_sum`), each minimum over the positive leaves below."""
    sizes, n = [], len(leaves)
    while True:
        sizes.append(-(-n // k) * k)
        if n <= top:
            break
        n = -(-n // k)
    sums = [np.zeros(sizes[0])]
    sums[0][: len(leaves)] = leaves
    mins: list[np.ndarray] = []
    for size in sizes[1:]:
        ch = sums[-1].reshape(-1, k).T  # (k, n)
        low = np.where(ch == 0.0, np.inf, ch) if not mins else mins[-1].reshape(-1, k).T
        sums.append(np.zeros(size))
        sums[-1][: ch.shape[1]] = reference_sum(ch)
        mins.append(np.full(size, np.inf))
        mins[-1][: ch.shape[1]] = low.min(0)
    return sums, mins


@pytest.mark.parametrize("fanout,top", [(2, 1), (4, 8), (16, 4096), (16, 64), (7, 5)])
def test_compiled_tree_equals_a_numpy_reference(fanout, top):
    """The compiled kernels against plain numpy on 20k leaves with zeros and duplicate updates: every sum and
    minimum bit for bit, the total and minimum, and the draws: the inverse CDF of the leaves' running sums
    wherever ``u`` is not within rounding of a boundary, and a positive leaf everywhere."""
    rng = np.random.default_rng(fanout * 100 + top)
    n = 20_000
    tree = SumTree(n, fanout, top=top)
    for _ in range(20):
        idx = rng.integers(0, n, size=int(rng.integers(1, 2000)))
        tree.update(idx, rng.exponential(size=len(idx)) * (rng.uniform(size=len(idx)) < 0.9))
    leaves = tree.leaves.copy()
    sums, mins = reference_levels(leaves, fanout, top)
    for got, want in zip(tree.sums + tree.mins, sums + mins, strict=True):
        assert np.array_equal(got, want)
    assert tree.total() == np.cumsum(sums[-1])[-1]
    assert tree.min() == leaves[leaves > 0].min()
    r = rng.uniform(size=20_000)
    ends = np.cumsum(leaves)
    u = r * ends[-1]
    want = np.searchsorted(ends, u, side="right")
    got = tree.draw(r)
    assert (leaves[got] > 0).all()
    gap = np.minimum(np.abs(u - ends[np.minimum(want, n - 1)]), np.abs(u - np.r_[0.0, ends][want]))
    clear = gap > 1e-9 * ends[-1]
    assert clear.mean() > 0.99 and np.array_equal(got[clear], want[clear])
    order = np.argsort(r)  # ascending draws walk the top level, the others search it: the same leaves
    assert np.array_equal(tree.draw(r[order]), got[order])


def test_draws_at_the_top_of_the_range_land_on_the_last_positive_leaf():
    """``u`` rounded onto (or past) the children's sum is drawn from the last non-empty child, never an
    empty slot: here the last 30 leaves of each level's block are empty."""
    for fanout, top in [(2, 1), (16, 4096), (16, 4)]:
        leaves = np.r_[np.full(70, 0.1), np.zeros(30)]
        tree = SumTree(100, fanout, top=top)
        tree.update(np.arange(100), leaves)
        got = tree.draw(np.array([0.0, 0.5, np.nextafter(1.0, 0.0), 1.0]))
        assert got[0] == 0 and got[-1] == 69 and got[-2] == 69 and (leaves[got] > 0).all()


def test_kernel_inputs_are_normalised_and_checked():
    """Any integer or float dtype goes through one compiled signature per kernel (no recompiling), and a slot
    outside the capacity is an IndexError rather than a write into the padding."""
    import arl_models.sum_tree as per_module

    tree = SumTree(100, 16)
    tree.update(np.arange(10, dtype=np.int32), np.ones(10, np.float32))
    tree.update(np.array([3, 3]), np.array([2.0, 1.0]))
    tree.draw(np.linspace(0, 0.99, 5, dtype=np.float32))
    assert tree.leaves[3] == 2.0 and tree.total() == 11.0
    with pytest.raises(IndexError):
        tree.update(np.array([100]), np.array([1.0]))
    with pytest.raises(IndexError):
        tree.update(np.array([-1]), np.array([1.0]))
    per = filled(10, PERConfig())
    per.update_priorities(torch.arange(4, dtype=torch.int32), torch.rand(4, dtype=torch.float64))
    per.update_priorities(torch.arange(4), torch.rand(4))
    with pytest.raises(IndexError):
        per.update_priorities(torch.tensor([100_000]), torch.tensor([1.0]))
    for name in per_module._KERNELS:
        if name not in per_module._INLINED:
            assert len(getattr(per_module, name).signatures) <= 1, name


def test_duplicate_indices_in_one_update():
    per = filled(10, PERConfig(alpha=1.0, eps=1e-9))
    per.update_priorities(torch.tensor([3, 3, 5, 3]), torch.tensor([1.0, 4.0, -2.0, 0.5]))
    leaves = per.tree.leaves[:10]
    # largest |TD| wins; sign ignored
    assert leaves[3] == pytest.approx(4.0) and leaves[5] == pytest.approx(2.0)
    assert leaves[0] == 1.0  # untouched items keep the initial max priority
    assert per.tree.total() == pytest.approx(leaves.sum(), rel=1e-12)
    assert per.max_priority == pytest.approx(4.0)
    per.add(**rows(1, 10))
    assert per.tree.leaves[10] == pytest.approx(4.0)  # a new transition enters at the max priority


def test_add_returns_the_slots_written_and_wraps():
    per = PrioritizedReplay(8, OBS, ACT, PERConfig())
    assert per.add(**rows(5)).tolist() == [0, 1, 2, 3, 4]
    assert per.add(**rows(5, 5)).tolist() == [5, 6, 7, 0, 1]
    assert per.add(**rows(20, 10)).tolist() == [2, 3, 4, 5, 6, 7, 0, 1]  # only the last 8 of 20 kept
    assert per.counter == 30 and sorted(per.inserted.tolist()) == list(range(22, 30))
    assert sorted(per.buffer.data["rew"].tolist()) == list(range(22, 30))


# ---- importance-sampling weights ----------------------------------------------------------------------
@pytest.mark.parametrize("normalize", ["buffer", "batch"])
def test_importance_weights_equal_the_closed_form(normalize):
    n = 40
    td = np.linspace(0.1, 5.0, n)
    cfg = PERConfig(alpha=0.6, beta=0.7, normalize=normalize, seed=0)
    per = filled(n, cfg, td=td)
    p = (td + cfg.eps) ** cfg.alpha
    prob = p / p.sum()
    batch, idx, w = per.sample(64)
    w_all = (n * prob) ** -cfg.beta
    max_w = w_all.max() if normalize == "buffer" else w_all[idx.numpy()].max()
    np.testing.assert_allclose(w.numpy(), w_all[idx.numpy()] / max_w, rtol=1e-6)
    assert w.dtype == torch.float32 and w.max() <= 1.0 + 1e-6
    assert torch.equal(batch.rew, idx.float())  # the rows are the slots drawn


def test_beta_anneals_linearly():
    td = np.linspace(0.5, 2.0, 10)
    per = filled(10, PERConfig(alpha=1.0, beta=0.4, beta_final=1.0, beta_steps=4), td=td)
    prob = (td + 1e-6) / (td + 1e-6).sum()
    betas = []
    for _ in range(6):
        betas.append(per.beta())
        _, idx, w = per.sample(4)
        np.testing.assert_allclose(w.numpy(), (prob[idx.numpy()] / prob.min()) ** -betas[-1], rtol=1e-6)
    np.testing.assert_allclose(betas, [0.4, 0.55, 0.7, 0.85, 1.0, 1.0])


# ---- freshness --------------------------------------------------------------------------------------
def newest_share(lam: float, n: int, k: int) -> float:
    return (1 - math.exp(-lam * k)) / (1 - math.exp(-lam * n)) if lam else k / n


@pytest.mark.parametrize("half_life", [None, 400.0, 100.0])
def test_freshness_shifts_sampling_to_new_data_by_the_configured_amount(half_life):
    n, k, draws = 2000, 200, 100_000
    lam = half_life_freshness(half_life) if half_life else 0.0
    per = PrioritizedReplay(n, OBS, ACT, PERConfig(freshness=lam, seed=5))
    for start in range(0, n, 100):  # as a loop adds them, a chunk at a time
        per.add(**rows(100, start))
    idx, _ = per.sample_indices(draws)
    measured = float((per.inserted[idx.numpy()] >= n - k).mean())
    expected = newest_share(lam, n, k)
    sd = math.sqrt(expected * (1 - expected) / draws)
    assert abs(measured - expected) < 4 * sd, (measured, expected)
    if half_life == 100.0:
        assert expected > 0.75  # the newest 10% take three quarters of the draws


def test_freshness_combines_with_priorities_and_survives_rescaling():
    """P(i) ~ p_i^alpha exp(lambda c_i) exactly, after rescales and with a wrapped ring buffer."""
    lam, cap = 0.05, 500
    per = PrioritizedReplay(cap, OBS, ACT, PERConfig(alpha=0.5, freshness=lam))
    rng = np.random.default_rng(0)
    for start in range(0, 3000, 50):  # lambda * 3000 = 150: two rescales
        per.add(**rows(50, start))
        idx, _ = per.sample_indices(32)
        per.update_priorities(idx, torch.as_tensor(rng.exponential(size=32)))
    assert per.ref > 0
    base = per.tree.leaves / np.exp(lam * (per.inserted - per.ref))  # p^alpha, recovered
    logp = np.log(base) + lam * per.inserted
    expected = np.exp(logp - logp.max())
    expected /= expected.sum()
    np.testing.assert_allclose(per.probabilities().numpy(), expected, rtol=1e-9, atol=1e-300)
    assert per.inserted.min() == 2500  # the ring keeps the newest 500


# ---- checkpoints ----------------------------------------------------------------------------------
def test_state_dict_round_trip_through_safetensors(tmp_path):
    cfg = PERConfig(freshness=0.01, seed=1)
    per = filled(300, cfg, capacity=1000, td=np.random.default_rng(0).exponential(size=300))
    for _ in range(3):
        _, idx, _ = per.sample(16)
        per.update_priorities(idx, torch.rand(16))
    save_file(per.state_dict(), str(tmp_path / "s.safetensors"))
    back = PrioritizedReplay(1000, OBS, ACT, cfg)
    back.load_state_dict(load_file(str(tmp_path / "s.safetensors")))
    for a, b in zip(per.tree.sums + per.tree.mins, back.tree.sums + back.tree.mins, strict=True):
        assert np.array_equal(a, b)
    for _ in range(3):  # the same draws, weights and updates afterwards
        (b1, i1, w1), (b2, i2, w2) = per.sample(16), back.sample(16)
        assert torch.equal(i1, i2) and torch.equal(w1, w2) and torch.equal(b1.obs, b2.obs)
        per.update_priorities(i1, w1)
        back.update_priorities(i2, w2)
    assert per.counter == back.counter and per.max_priority == back.max_priority


# ---- the algorithms ---------------------------------------------------------------------------------
def _batch(n: int = 32) -> MCBatch:
    g = torch.Generator().manual_seed(0)
    return MCBatch(
        torch.randn(n, OBS, generator=g),
        torch.rand(n, ACT, generator=g) * 2 - 1,
        torch.randn(n, generator=g),
        torch.zeros(n),
        torch.randn(n, OBS, generator=g),
        torch.zeros(n),
        mc_return=torch.zeros(n),
    )


SMALL = dict(hidden=(16, 16), batch_size=32)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SAC(OBS, ACT, SACConfig(**SMALL)),
        lambda: CQL(OBS, ACT, CQLConfig(**SMALL, n_action_samples=2)),
        lambda: CalQL(OBS, ACT, CalQLConfig(**SMALL, n_action_samples=2, conservative="none")),
    ],
    ids=["sac", "cql", "calql-none"],
)
def test_weighted_td_loss_and_per_sample_errors(make):
    algo, b = make(), _batch()
    with torch.no_grad():
        na, nl = algo.actor.sample(b.next_obs)
        target = algo.td_target(b, na, nl)
        q = algo.critic(b.obs, b.act)
    w = torch.rand(32)
    torch.manual_seed(0)
    loss_w, _ = algo.critic_loss(b, na, nl, weights=w)
    td_err = algo.td_error.clone()
    torch.manual_seed(0)
    loss_1, _ = algo.critic_loss(b, na, nl, weights=torch.ones(32))
    torch.manual_seed(0)
    loss_none, _ = algo.critic_loss(b, na, nl)
    td_part = ((q - target).pow(2) * w).mean(1).sum()
    plain = (q - target).pow(2).mean(1).sum()
    assert torch.equal(loss_1, loss_none)  # weights of one are the unweighted loss, exactly
    assert torch.allclose(loss_w - loss_none, td_part - plain, atol=1e-5)  # only the TD term is weighted
    torch.testing.assert_close(td_err, (q - target).abs().mean(0))
    assert td_err.shape == (32,)


def test_prioritized_mixed_batch_weights_only_the_online_rows():
    off = ReplayBuffer(100, OBS, ACT)
    off.add(**rows(100))
    on = filled(50, PERConfig(seed=0), capacity=50, td=np.linspace(0.1, 3, 50))
    batch, idx, w = sample_mixed_prioritized(off, on, 32, 0.25, torch.zeros(100), torch.zeros(50))
    assert len(idx) == 24 and w.shape == (32,)
    assert torch.equal(w[:8], torch.ones(8)) and (w[8:] <= 1).all() and (w[8:] < 1).any()
    assert torch.equal(batch.rew[8:], idx.float())


# ---- the stages ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pendulum_data(tmp_path_factory):
    return write_pendulum_data(tmp_path_factory.mktemp("data") / "v1.0.0")


@pytest.fixture(scope="module")
def tiny_cql(tmp_path_factory, pendulum_data):
    from arl_models.offline import train_cql

    out = tmp_path_factory.mktemp("cql") / "cql"
    train_cql(pendulum_data, out, steps=20, config=TINY_CQL, progress=False, eval_episodes=0)
    return out


PER_FT = FinetuneConfig(
    steps=1200,
    num_envs=2,
    vector="sync",
    utd=0.05,
    eval_episodes=0,
    batch_size=32,
    prioritized=PERConfig(freshness=half_life_freshness(200.0)),
)


def _same_train_state(a, b):
    wa = load_file(str(a / "train_state" / "state.safetensors"))
    wb = load_file(str(b / "train_state" / "state.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    return wa


def test_finetune_with_prioritized_replay_resumes_exactly(tiny_cql, pendulum_data, tmp_path):
    finetune(tiny_cql, tmp_path / "a", data=pendulum_data, config=PER_FT, progress=False)
    finetune(tiny_cql, tmp_path / "b", data=pendulum_data, config=PER_FT, progress=False, stop_after_rounds=1)
    finetune(tiny_cql, tmp_path / "b", data=pendulum_data, config=PER_FT, progress=False)
    state = _same_train_state(tmp_path / "a", tmp_path / "b")
    leaves = state["replay.per.leaves"]
    assert len(leaves) == 1200 and len(set(leaves.tolist())) > 100  # priorities were set by TD errors
    assert state["replay.per.counters"][0] == 1200
    rows_ = [json.loads(ln) for ln in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert 0 < rows_[-1]["online/is_weight_mean"] <= 1.0
    rec = json.loads((tmp_path / "a" / "config.json").read_text())
    assert rec["finetune"]["prioritized"]["freshness"] == PER_FT.prioritized.freshness


def test_offline_cql_with_prioritized_replay_resumes_exactly(pendulum_data, tmp_path):
    from arl_models.offline import train_cql

    kw = dict(config=TINY_CQL, progress=False, eval_episodes=0, prioritized=PERConfig(alpha=0.6, beta=0.4))
    train_cql(pendulum_data, tmp_path / "a", steps=30, **kw)
    train_cql(pendulum_data, tmp_path / "b", steps=12, **kw)
    train_cql(pendulum_data, tmp_path / "b", steps=30, **kw)
    state = _same_train_state(tmp_path / "a", tmp_path / "b")
    assert len(set(state["replay.per.leaves"].tolist())) > 30
    plain = tmp_path / "plain"
    train_cql(pendulum_data, plain, steps=30, **(kw | {"prioritized": None}))
    assert not any(
        k.startswith("replay.per") for k in load_file(str(plain / "train_state" / "state.safetensors"))
    )


def test_per_config_validates():
    with pytest.raises(ValueError):
        PERConfig(normalize="mean")
    with pytest.raises(ValueError):
        PERConfig(beta=1.5)
    assert replace(PERConfig(), freshness=0.1).freshness == 0.1
