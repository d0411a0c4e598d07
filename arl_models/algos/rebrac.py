"""ReBRAC: TD3+BC with behaviour regularisation in the critic too, plus a cost critic and constraint.

Tarasov, Kurenkov, Nikulin and Kolesnikov, "Revisiting the Minimalist Approach to Offline Reinforcement
Learning" (NeurIPS 2023). TD3's critics (clipped double-Q, target policy smoothing, delayed actor and
target updates) with three changes from TD3+BC:

* the actor minimises ``beta_a sum_A (pi(s) - a)^2 - lambda min_e Q_e(s, pi(s))``, ``lambda = 1 / mean |Q|``
  (no ``alpha``: the BC weight ``beta_a`` carries the balance);
* the critic's target penalises the smoothed target action's distance to the data's next action ``a'``,
  ``r + gamma (1 - done) (min_e Q'_e(s', a~') - beta_c sum_A (a~' - a')^2)``, so values of actions away
  from the data shrink where they are bootstrapped, not only where the actor is trained;
* the critics normalise every hidden layer (LayerNorm), large batches and larger learning rates.

The data's next action comes with the batch (``Batch.next_act``, from a buffer built with
``next_actions``: ``replay.next_actions_of``). The cost side is TD3+BC's (``td3bc.py``, ``constrained.py``):
``Q_c`` learns the discounted cost by TD with the same smoothed target action (no penalty), and with
``cost_q_limit`` set the actor maximises ``lambda (Q - nu Q_c)``, ``nu`` the PID Lagrange multiplier and
``lambda`` TD3+BC's over the whole objective.
The policy is the tanh-Gaussian actor acting by its mean, its ``log_std`` head learning the data's spread
as TD3+BC's does, so a BC actor warm-starts it and fine-tuning takes it as it takes TD3+BC's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arl_models.algos.bc import clipped_gaussian_log_prob
from arl_models.algos.constrained import priced
from arl_models.algos.sac import _frozen, td_loss
from arl_models.algos.td3bc import DelayedActorCritic, TD3Config
from arl_models.nets import EnsembleCritic, TanhGaussianActor
from arl_models.replay import Batch

SPREAD_WEIGHT = 0.01
"""Weight of the ``log_std`` head's likelihood term in the actor's loss (TD3+BC's)."""


@dataclass(frozen=True)
class ReBRACConfig(TD3Config):
    """ReBRAC's settings; the defaults are CORL's (tinkoff-ai/CORL at 6afec90, ``algorithms/offline/
    rebrac.py`` and ``configs/offline/rebrac/hopper/medium_v2.yaml``), except the network depth: CORL's
    actor and critics have three hidden layers of 256 (``rebrac.py`` lines 42-44), ours the two of
    ``hidden`` that every algorithm here shares, so a BC actor of the same preset warm-starts the actor
    whole. ``gamma`` 0.99 and ``tau`` 5e-3 are CORL's too (lines 45-46)."""

    actor_lr: float = 1e-3
    """CORL ``rebrac.py`` line 40."""
    critic_lr: float = 1e-3
    """CORL ``rebrac.py`` line 41."""
    batch_size: int = 1024
    """CORL ``rebrac.py`` line 57."""
    actor_bc_coef: float = 0.01
    """``beta_a``, weight of ``sum_A (pi(s) - a)^2`` in the actor's loss; CORL's for hopper-medium-v2
    (``hopper/medium_v2.yaml`` line 1; its per-dataset values run from 0.001 to 1)."""
    critic_bc_coef: float = 0.01
    """``beta_c``, weight of ``sum_A (a~' - a')^2`` in the critic's target; CORL's for hopper-medium-v2
    (``hopper/medium_v2.yaml`` line 6)."""
    critic_layer_norm: bool = True
    """LayerNorm after every hidden ReLU of the reward critics (CORL ``rebrac.py`` line 50; the actor has
    none, line 49). The cost critics are TD3+BC's, without it."""
    normalize_q: bool = True
    """Scale the critic term by ``1 / mean |Q|`` (CORL ``rebrac.py`` line 54)."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise, in the [-1, 1] action space (CORL line 51)."""
    noise_clip: float = 0.5
    """Clip of that noise (CORL line 52)."""
    policy_freq: int = 2
    """Critic steps per actor (and target) step (CORL line 53)."""


@dataclass(frozen=True)
class ReBRACLosses:
    """The actor's loss and its parts (the critics' is one tensor, :func:`compute_critic_loss`)."""

    actor: torch.Tensor
    bc: torch.Tensor
    """``mean_B sum_A (pi(s) - a)^2``, before ``actor_bc_coef``."""
    q_scale: torch.Tensor
    """``lambda``, the critic term's scale (no gradient)."""
    qc: torch.Tensor
    """``Q_c(s, pi(s))`` ``(B,)`` without gradient; zeros without a cost critic."""

    def metrics(self) -> dict[str, float]:
        return {"loss_actor": self.actor.item(), "loss_bc": self.bc.item(), "q_scale": self.q_scale.item()}


def penalised_target(
    batch: Batch, q_next: torch.Tensor, next_act: torch.Tensor, gamma: float, critic_bc_coef: float
) -> torch.Tensor:
    """``r + gamma (1 - done) (q_next - beta_c sum_A (next_act - a')^2)`` ``(B,)``, ``a'`` the data's next
    action ``batch.next_act``."""
    assert batch.next_act is not None
    penalty = (next_act - batch.next_act).pow(2).sum(-1)  # (B,)
    return batch.rew + gamma * (1.0 - batch.done) * (q_next - critic_bc_coef * penalty)


def compute_critic_loss(
    critic: EnsembleCritic,
    critic_target: EnsembleCritic,
    batch: Batch,
    next_act: torch.Tensor,
    gamma: float,
    critic_bc_coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critics' squared TD error against the penalised target, and ``Q(s, a)`` ``(E, B)`` without
    gradient; ``next_act`` is the smoothed target action ``(B, A)``."""
    with torch.no_grad():
        q_next = critic_target(batch.next_obs, next_act).min(0).values  # (B,)
        target = penalised_target(batch, q_next, next_act, gamma, critic_bc_coef)
    q = critic(batch.obs, batch.act)  # (E, B)
    return td_loss(q, target), q.detach()


def compute_actor_loss(
    actor: TanhGaussianActor,
    critic: EnsembleCritic,
    batch: Batch,
    cfg: ReBRACConfig,
    cost_critic: EnsembleCritic | None = None,
    multiplier: float | None = None,
) -> ReBRACLosses:
    """The actor's loss; the critics take no gradient. With ``multiplier`` (the constrained actor) the
    objective is ``Q - multiplier * Q_c``, scaled by ``1 / (mean |Q| + multiplier mean |Q_c|)``."""
    act = actor.act_mean(batch.obs)  # (B, A)
    with _frozen(critic):
        q = critic(batch.obs, act).min(0).values  # (B,)
    qc = torch.zeros_like(q)
    if cost_critic is not None:
        with _frozen(cost_critic):
            qc = cost_critic(batch.obs, act).mean(0)
    objective, magnitude = priced(q, qc, multiplier if cost_critic is not None else None)
    scale = 1.0 / magnitude.clamp(min=1e-6) if cfg.normalize_q else q.new_ones(())
    bc = (act - batch.act).pow(2).sum(-1).mean()
    spread = -clipped_gaussian_log_prob(actor, batch.obs, batch.act, detach_mean=True).mean()
    loss = -(scale * objective).mean() + cfg.actor_bc_coef * bc + SPREAD_WEIGHT * spread
    return ReBRACLosses(actor=loss, bc=bc.detach(), q_scale=scale, qc=qc.detach())


class ReBRAC(DelayedActorCritic):
    """TD3's learner (networks, optimisers, warm start, the delayed update, the cost side) with ReBRAC's
    critics, critic target and actor loss."""

    name = "rebrac"
    config_cls = ReBRACConfig
    next_actions = True
    """Batches must carry the data's next action (``ReplayBuffer(..., next_actions=True)``)."""
    cfg: ReBRACConfig

    def make_critic(self, obs_dim: int, act_dim: int) -> EnsembleCritic:
        cfg = self.cfg
        return EnsembleCritic(
            obs_dim, act_dim, cfg.hidden, cfg.n_critics, cfg.context_dim, layer_norm=cfg.critic_layer_norm
        )

    def critic_loss(self, batch: Batch, next_act: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.next_act is None:
            raise ValueError(
                "ReBRAC needs the data's next actions: a ReplayBuffer built with next_actions=True"
            )
        loss, q = compute_critic_loss(
            self.critic, self.critic_target, batch, next_act, self.cfg.gamma, self.cfg.critic_bc_coef
        )
        return loss, {"q_data": q.mean().item()}

    def actor_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        multiplier = None
        if self.cost is not None and self.cfg.cost_q_limit is not None:
            multiplier = self.cost.lagrangian.value
        cost_critic = self.cost.critic if self.cost else None
        losses = compute_actor_loss(self.actor, self.critic, batch, self.cfg, cost_critic, multiplier)
        metrics = losses.metrics()
        return losses.actor, {k: v for k, v in metrics.items() if k != "loss_actor"}, losses.qc
