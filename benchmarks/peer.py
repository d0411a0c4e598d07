"""The peer (d3rlpy 2.8) built with the same shapes as ours, and the data plumbing both share.

Imported only by the benchmark scripts, which run in ``.venv-bench`` (see ``benchmarks/README.md``):
d3rlpy is never a dependency of ``arl_models``.

Observations: where our config standardises them (``normalize_obs``), d3rlpy gets a
``StandardObservationScaler`` of the same mean and standard deviation (``nets.obs_standardization``, which
leaves the context entries as they are; d3rlpy adds its ``eps`` of 1e-3 to the std); otherwise neither side
touches them. Actions: ours scale them to [-1, 1] with ``ActionScaler``,
d3rlpy with a ``MinMaxActionScaler`` of the same bounds. Rewards are not scaled on either side.

Differences that remain by design (they are the libraries' own choices):

All algorithms
- d3rlpy samples a batch with a Python loop over transitions (``sample_transition_batch``); ours is
  one ``randint`` and one ``index_select`` per field.
- An MDPDataset derives ``next_obs`` from the next row, so the last transition of an episode that
  ends by time-out is dropped on d3rlpy's side (0.5% of Pendulum's rows, 0.1% of Hopper's).
- Ours learn a cost critic (and, constrained, a Lagrange multiplier) beside the reward side, and
  FiLM-condition on the task's context entries (``context_dim``); d3rlpy does neither (the context
  entries are plain inputs to it).

CQL
- d3rlpy evaluates the critics one by one; ours runs the ensemble in one ``baddbmm`` per layer and the
  ``1 + 3N`` action sets in one fused call.
- d3rlpy's policy clamps ``log_std`` to [-20, 2], ours to [-5, 2].

TD3+BC
- d3rlpy's actor is deterministic, ``tanh(mu(s))``; ours is the tanh-Gaussian actor acting by the same
  mean, whose ``log_std`` head also learns (``0.01`` times the clipped-Gaussian likelihood around the
  detached mean), a term that reaches the mean only through the shared trunk.
- The BC term: both average the squared error over batch and action entries (the paper's ``F.mse_loss``).
- d3rlpy updates actor and targets at gradient steps 0, 2, 4... (its counter before the step), ours at
  2, 4, 6...: the same number of actor steps, give or take one.

IQL
- d3rlpy steps Q and V together, one Adam at ``critic_learning_rate`` on the sum of their losses (our
  ``value_lr`` has no counterpart there); ours steps V first with its own Adam, then Q towards
  ``r + gamma V(s')`` with the updated V.
- The advantage of the actor's weights uses V after this step's update on d3rlpy's side, before it on ours.
- d3rlpy's actor is a Gaussian with mean ``tanh(mu(s))`` and a state-independent ``log_std`` (a parameter
  squashed into [-5, 2]) under the plain Gaussian likelihood; ours has a state-dependent ``log_std`` head
  clamped to [-5, 2] and the likelihood censored at the bounds (``clipped_gaussian_log_prob``).
- No learning-rate schedule on either side: d3rlpy 2.8.1's ``IQLConfig`` defaults to plain Adam (the
  paper's cosine decay of the actor's rate, with a return-based reward scale, is in d3rlpy's reproduction
  script ``reproductions/offline/iql.py``, not in its defaults).

ReBRAC
- d3rlpy's actor is deterministic, ours the tanh-Gaussian acting by its mean with TD3+BC's ``log_std``
  term; actor and target updates at d3rlpy's and our steps as for TD3+BC.
- LayerNorm: d3rlpy's comes from the critic encoder (``use_layer_norm``, after each hidden ReLU, as
  CORL's); ours from ``EnsembleCritic(layer_norm=True)``, the same place. Both give the actor none.
- The data's next action: d3rlpy's transition picker takes the next row's, zeros after a terminal row, and
  drops the time-out row; ours takes the next row of the same episode, the row's own action at the end of
  an episode (``replay.next_actions_of``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from arl_models.algos.iql import IQLConfig
from arl_models.algos.rebrac import ReBRACConfig
from arl_models.algos.td3bc import TD3BCConfig
from arl_models.data.dataset import Transitions


def random_transitions(
    n: int, obs_dim: int, act_dim: int, episode_len: int = 1000, seed: int = 0
) -> Transitions:
    """Random but fixed data: Gaussian observations, uniform actions in [-1, 1], episodes ending by
    time-out."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, obs_dim)).astype(np.float32)
    episode_id = np.arange(n) // episode_len
    step = (np.arange(n) % episode_len).astype(np.int32)
    truncated = (step == episode_len - 1) | (np.arange(n) == n - 1)
    return Transitions(
        obs=obs[:n],
        action=rng.uniform(-1.0, 1.0, (n, act_dim)).astype(np.float32),
        reward=rng.standard_normal(n).astype(np.float32),
        cost=np.zeros(n, np.float32),
        next_obs=obs[1:],
        terminated=np.zeros(n, bool),
        truncated=truncated,
        episode_id=episode_id.astype(np.int64),
        step=step,
        env_version=np.full(n, "bench", object),
        policy_hash=np.full(n, "random", object),
        random_seed=np.full(n, seed, np.int64),
        timestamp=np.full(n, "", object),
    )


def to_mdp_dataset(t: Transitions) -> Any:
    """Our transitions as a d3rlpy ``MDPDataset``: the same rows, raw actions, episode ends marked.

    The last row of the data is marked as a time-out when it ends no episode (a rollout cut short).
    """
    import d3rlpy

    ep = t.episode_id
    ends = np.ones(len(t), bool)
    ends[:-1] = ep[1:] != ep[:-1]
    terminals = t.terminated.astype(np.float32)
    timeouts = (ends & ~t.terminated).astype(np.float32)
    return d3rlpy.dataset.MDPDataset(
        observations=t.obs,
        actions=t.action,
        rewards=t.reward,
        terminals=terminals,
        timeouts=timeouts,
        action_space=d3rlpy.ActionSpace.CONTINUOUS,
    )


def _encoder(hidden: tuple[int, ...], layer_norm: bool = False) -> Any:
    from d3rlpy.models.encoders import VectorEncoderFactory

    return VectorEncoderFactory(hidden_units=list(hidden), use_layer_norm=layer_norm)


def _action_scaler(low: np.ndarray | None, high: np.ndarray | None) -> Any:
    if low is None or high is None:
        return None
    from d3rlpy.preprocessing import MinMaxActionScaler

    return MinMaxActionScaler(minimum=np.asarray(low, np.float32), maximum=np.asarray(high, np.float32))


ObsStandardization = tuple[np.ndarray, np.ndarray] | None
"""``(mean, std)`` of the observations for d3rlpy's ``StandardObservationScaler``, or ``None``: raw."""


def _obs_scaler(stats: ObsStandardization) -> Any:
    if stats is None:
        return None
    from d3rlpy.preprocessing import StandardObservationScaler

    mean, std = stats
    return StandardObservationScaler(mean=np.asarray(mean, np.float32), std=np.asarray(std, np.float32))


def d3rlpy_cql(
    dataset: Any,
    *,
    hidden: tuple[int, ...] = (256, 256),
    batch_size: int = 256,
    n_action_samples: int = 10,
    n_critics: int = 2,
    actor_lr: float = 1e-4,
    critic_lr: float = 3e-4,
    temp_lr: float = 1e-4,
    alpha_lr: float = 1e-4,
    conservative_weight: float = 5.0,
    gamma: float = 0.99,
    tau: float = 0.005,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
    obs_stats: ObsStandardization = None,
) -> Any:
    """d3rlpy's CQL, built on ``dataset``. ``alpha_lr=0`` keeps alpha at 1: a fixed conservative weight.

    d3rlpy's default (``alpha_lr=1e-4``, ``alpha_threshold=10``) is its Lagrangian variant; with
    ``alpha_lr=0`` its critic loss is ``w * (gap - 10)``, whose gradient is our fixed-weight ``w * gap``.
    """
    import d3rlpy

    cfg = d3rlpy.algos.CQLConfig(
        actor_encoder_factory=_encoder(hidden),
        critic_encoder_factory=_encoder(hidden),
        batch_size=batch_size,
        n_action_samples=n_action_samples,
        n_critics=n_critics,
        actor_learning_rate=actor_lr,
        critic_learning_rate=critic_lr,
        temp_learning_rate=temp_lr,
        alpha_learning_rate=alpha_lr,
        conservative_weight=conservative_weight,
        gamma=gamma,
        tau=tau,
        action_scaler=_action_scaler(action_low, action_high),
        observation_scaler=_obs_scaler(obs_stats),
    )
    algo = cfg.create(device=False)
    algo.build_with_dataset(dataset)
    return algo


def d3rlpy_cql_like(dataset: Any, cfg: Any, *, alpha_lr: float, **kw: Any) -> Any:
    """d3rlpy's CQL with the networks, batch, samples and learning rates of our ``CQLConfig``."""
    return d3rlpy_cql(
        dataset,
        hidden=cfg.hidden,
        batch_size=cfg.batch_size,
        n_action_samples=cfg.n_action_samples,
        n_critics=cfg.n_critics,
        actor_lr=cfg.actor_lr,
        critic_lr=cfg.critic_lr,
        temp_lr=cfg.temp_lr,
        alpha_lr=alpha_lr,
        conservative_weight=cfg.conservative_weight,
        gamma=cfg.gamma,
        tau=cfg.tau,
        **kw,
    )


def d3rlpy_bc(
    dataset: Any,
    *,
    hidden: tuple[int, ...] = (256, 256),
    batch_size: int = 256,
    lr: float = 1e-3,
    policy_type: str = "stochastic",
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
    obs_stats: ObsStandardization = None,
) -> Any:
    """d3rlpy's BC; ``stochastic`` is the Gaussian log-likelihood (our ``gaussian``), else
    ``deterministic``."""
    import d3rlpy

    cfg = d3rlpy.algos.BCConfig(
        encoder_factory=_encoder(hidden),
        batch_size=batch_size,
        learning_rate=lr,
        policy_type=policy_type,
        action_scaler=_action_scaler(action_low, action_high),
        observation_scaler=_obs_scaler(obs_stats),
    )
    algo = cfg.create(device=False)
    algo.build_with_dataset(dataset)
    return algo


def d3rlpy_td3bc(
    dataset: Any,
    cfg: TD3BCConfig,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
    obs_stats: ObsStandardization = None,
) -> Any:
    """d3rlpy's TD3+BC with the networks, batch, learning rates and TD3 settings of our ``TD3BCConfig``."""
    import d3rlpy

    peer_cfg = d3rlpy.algos.TD3PlusBCConfig(
        actor_encoder_factory=_encoder(cfg.hidden),
        critic_encoder_factory=_encoder(cfg.hidden),
        batch_size=cfg.batch_size,
        actor_learning_rate=cfg.actor_lr,
        critic_learning_rate=cfg.critic_lr,
        gamma=cfg.gamma,
        tau=cfg.tau,
        n_critics=cfg.n_critics,
        alpha=cfg.alpha,
        target_smoothing_sigma=cfg.policy_noise,
        target_smoothing_clip=cfg.noise_clip,
        update_actor_interval=cfg.policy_freq,
        action_scaler=_action_scaler(action_low, action_high),
        observation_scaler=_obs_scaler(obs_stats),
    )
    algo = peer_cfg.create(device=False)
    algo.build_with_dataset(dataset)
    return algo


def d3rlpy_iql(
    dataset: Any,
    cfg: IQLConfig,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
    obs_stats: ObsStandardization = None,
) -> Any:
    """d3rlpy's IQL with the networks, batch, learning rates and IQL settings of our ``IQLConfig``
    (d3rlpy's value network shares the critics' optimiser and rate: ``cfg.value_lr`` has no counterpart)."""
    import d3rlpy

    peer_cfg = d3rlpy.algos.IQLConfig(
        actor_encoder_factory=_encoder(cfg.hidden),
        critic_encoder_factory=_encoder(cfg.hidden),
        value_encoder_factory=_encoder(cfg.hidden),
        batch_size=cfg.batch_size,
        actor_learning_rate=cfg.actor_lr,
        critic_learning_rate=cfg.critic_lr,
        gamma=cfg.gamma,
        tau=cfg.tau,
        n_critics=cfg.n_critics,
        expectile=cfg.expectile,
        weight_temp=cfg.beta,
        max_weight=cfg.max_weight,
        action_scaler=_action_scaler(action_low, action_high),
        observation_scaler=_obs_scaler(obs_stats),
    )
    algo = peer_cfg.create(device=False)
    algo.build_with_dataset(dataset)
    return algo


def d3rlpy_rebrac(
    dataset: Any,
    cfg: ReBRACConfig,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
    obs_stats: ObsStandardization = None,
) -> Any:
    """d3rlpy's ReBRAC with the networks (LayerNorm in the critics or not), batch, learning rates, TD3
    settings and BC coefficients of our ``ReBRACConfig``."""
    import d3rlpy

    peer_cfg = d3rlpy.algos.ReBRACConfig(
        actor_encoder_factory=_encoder(cfg.hidden),
        critic_encoder_factory=_encoder(cfg.hidden, layer_norm=cfg.critic_layer_norm),
        batch_size=cfg.batch_size,
        actor_learning_rate=cfg.actor_lr,
        critic_learning_rate=cfg.critic_lr,
        gamma=cfg.gamma,
        tau=cfg.tau,
        n_critics=cfg.n_critics,
        target_smoothing_sigma=cfg.policy_noise,
        target_smoothing_clip=cfg.noise_clip,
        actor_beta=cfg.actor_bc_coef,
        critic_beta=cfg.critic_bc_coef,
        update_actor_interval=cfg.policy_freq,
        action_scaler=_action_scaler(action_low, action_high),
        observation_scaler=_obs_scaler(obs_stats),
    )
    algo = peer_cfg.create(device=False)
    algo.build_with_dataset(dataset)
    return algo


def d3rlpy_act_fn(algo: Any):
    """Environment actions for a batch of observations (d3rlpy's ``predict`` undoes its action scaler)."""

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return algo.predict(np.asarray(obs, np.float32))

    return act
