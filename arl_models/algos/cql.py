"""Conservative Q-Learning for continuous actions (SAC-based).

Kumar, Zhou, Tucker and Levine, "Conservative Q-Learning for Offline Reinforcement Learning"
(NeurIPS 2020), the CQL(H) variant: each critic's Bellman loss gets the term

    w * ( log sum_a exp Q(s, a)  -  Q(s, a_data) )

where the log-sum-exp is estimated by importance sampling over ``N`` uniform actions and ``N``
actions from the current policy at ``s`` and at ``s'``. The weight ``w`` is fixed, or with
``lagrangian_threshold`` set it is tuned by dual gradient ascent so that the gap stays near the
threshold (the paper's CQL-Lagrange). All ``1 + 3N`` action sets of a batch pass through the critic
ensemble in a single fused call. The cost critic, temperature and actor are SAC's; the actor can
start from a BC actor (:meth:`SAC.warm_start_actor`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from arl_models.algos.bc import compute_bc_loss
from arl_models.algos.sac import SAC, SACConfig, td_loss
from arl_models.nets import adam
from arl_models.replay import Batch


@dataclass(frozen=True)
class CQLConfig(SACConfig):
    normalize_obs: bool = True
    """Standardise every network's input with the observation statistics of the dataset an offline stage
    trains on (``nets.ObsNorm``; TD3+BC's state normalisation). SAC has no dataset and acts on raw inputs;
    a warm start carries its checkpoint's statistics."""
    actor_lr: float = 1e-4
    temp_lr: float = 1e-4
    n_action_samples: int = 10
    """Actions sampled per state (each of uniform, pi(s), pi(s')) for the log-sum-exp."""
    conservative_weight: float = 5.0
    """Weight ``w`` of the conservative term."""
    lagrangian_threshold: float | None = None
    """With a value, tune the weight so that the conservative gap stays at this threshold."""
    alpha_lr: float = 1e-4
    """Learning rate of the conservative weight's multiplier (Lagrangian variant only)."""
    init_alpha: float = 1.0
    backup_entropy: bool = False
    """Subtract the entropy term in the TD target as SAC does; CQL (the paper, d3rlpy, CORL) does not."""
    actor_warmup_steps: int = 0
    """For this many steps of a run (each continual stage restarts the count) the actor imitates the
    batch's actions, ``temperature * log pi(a|s) - log pi(a_data|s)``, while the critics learn; then it
    follows the critic. A fresh or shifted critic otherwise pulls a BC-initialised actor off the data at
    once (the ``policy_eval_start`` of Kumar et al.'s code). The cost multiplier waits for it too."""
    critic_precision: str = "float32"
    """``bfloat16`` runs the fused critic pass (all ``1 + 3N`` action sets) under bf16 autocast with
    float32 weights and losses, at bf16's 8-bit mantissa (benchmarks/README.md, "CQL and BC throughput")."""


@dataclass(frozen=True)
class CQLLosses:
    td: torch.Tensor
    conservative: torch.Tensor
    alpha: torch.Tensor | None

    def metrics(self) -> dict[str, float]:
        out = {"loss_td": self.td.item(), "loss_conservative": self.conservative.item()}
        if self.alpha is not None:
            out["loss_alpha"] = self.alpha.item()
        return out


def conservative_gap(
    q_data: torch.Tensor, q_sampled: torch.Tensor, log_density: torch.Tensor
) -> torch.Tensor:
    """Per-critic ``logsumexp_a Q(s,a) - Q(s, a_data)`` by importance sampling, averaged over the batch.

    q_data: (E, B); q_sampled: (E, B, K) for K sampled actions; log_density: (B, K) of the proposal.
    """
    k = q_sampled.shape[-1]
    lse = torch.logsumexp(q_sampled - log_density.unsqueeze(0), dim=-1) - math.log(k)  # (E, B)
    return (lse - q_data).mean(-1)  # (E,)


class CQL(SAC):
    name = "cql"
    config_cls = CQLConfig
    cfg: CQLConfig

    def __init__(self, obs_dim: int, act_dim: int, cfg: CQLConfig, device: str | torch.device = "cpu"):
        super().__init__(obs_dim, act_dim, cfg, device)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.init_alpha), device=self.device))
        self.alpha_opt = adam([self.log_alpha], lr=cfg.alpha_lr)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return super().optimizers() | {"alpha": self.alpha_opt}

    def parameters(self) -> dict[str, nn.Parameter]:
        return super().parameters() | {"log_alpha": self.log_alpha}

    def td_target(self, batch: Batch, next_act: torch.Tensor, next_logp: torch.Tensor) -> torch.Tensor:
        if self.cfg.backup_entropy:
            return super().td_target(batch, next_act, next_logp)
        q_next = self.critic_target(batch.next_obs, next_act).min(0).values  # (B,)
        return batch.rew + self.cfg.gamma * (1.0 - batch.done) * q_next

    def actor_loss(
        self, obs: torch.Tensor, data_act: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if data_act is None or self.step >= self.cfg.actor_warmup_steps:
            return super().actor_loss(obs, data_act)
        _, logp = self.actor.sample(obs)
        return self.temperature * logp.mean() + compute_bc_loss(self.actor, obs, data_act).actor, logp, None

    def sample_actions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``N`` uniform, ``N`` pi(s) and ``N`` pi(s') actions per state, with their log-densities.

        Returns actions (B, 3N, A) and log-densities (B, 3N), all without gradient.
        """
        b, n, a = batch.obs.shape[0], self.cfg.n_action_samples, self.act_dim
        with torch.no_grad():
            both = torch.cat([batch.obs, batch.next_obs]).repeat_interleave(n, 0)  # (2BN, O)
            pol_act, pol_logp = self.actor.sample(both)
            rand_act = torch.rand(b, n, a, device=self.device) * 2.0 - 1.0
            rand_logp = torch.full((b, n), -a * math.log(2.0), device=self.device)
        pol_act = pol_act.view(2, b, n, a)
        pol_logp = pol_logp.view(2, b, n)
        acts = torch.cat([rand_act, pol_act[0], pol_act[1]], dim=1)  # (B, 3N, A)
        logp = torch.cat([rand_logp, pol_logp[0], pol_logp[1]], dim=1)  # (B, 3N)
        return acts, logp

    def compute_losses(
        self,
        batch: Batch,
        next_act: torch.Tensor,
        next_logp: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> tuple[CQLLosses, torch.Tensor]:
        """The losses and ``Q(s, a_data)`` ``(E, B)``; ``weights`` ``(B,)`` weight the TD term per sample
        (the conservative term is a regulariser over the batch's states and stays unweighted)."""
        with torch.no_grad():
            target = self.td_target(batch, next_act, next_logp)
        acts, logp = self.sample_actions(batch)
        b, k, _ = acts.shape
        obs_all = torch.cat([batch.obs, batch.obs.repeat_interleave(k, 0)])  # (B + BK, O)
        act_all = torch.cat([batch.act, acts.reshape(b * k, -1)])
        with torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.cfg.critic_precision == "bfloat16"
        ):
            # one fused ensemble pass per block of ~B*N rows: (E, rows, H) activations that stay in cache
            rows = max(b * self.cfg.n_action_samples, 1)
            q_all = torch.cat(
                [self.critic(o, a) for o, a in zip(obs_all.split(rows), act_all.split(rows), strict=True)],
                dim=1,
            ).float()  # (E, B + BK)
        q_data, q_sampled = q_all[:, :b], q_all[:, b:].view(-1, b, k)
        q_sampled = self.bound_sampled_q(q_sampled, batch)
        td = td_loss(q_data, target, weights)
        self.td_error = (q_data.detach() - target).abs().mean(0)
        gap = conservative_gap(q_data, q_sampled, logp)  # (E,)
        alpha_loss = None
        if self.cfg.lagrangian_threshold is None:
            conservative = self.cfg.conservative_weight * gap.sum()
        else:
            alpha = self.log_alpha.exp().clamp(0.0, 1e6)
            slack = self.cfg.conservative_weight * gap - self.cfg.lagrangian_threshold
            conservative = (alpha.detach() * slack).sum()
            alpha_loss = -(alpha * slack.detach()).sum()
        return CQLLosses(td=td, conservative=conservative, alpha=alpha_loss), q_data

    def bound_sampled_q(self, q_sampled: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Hook on the sampled actions' Q-values ``(E, B, 3N)`` before the log-sum-exp; CQL leaves them
        as they are, Cal-QL (``calql.py``) bounds the policy actions' values below by Monte-Carlo returns."""
        return q_sampled

    def critic_loss(
        self,
        batch: Batch,
        next_act: torch.Tensor,
        next_logp: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        losses, q_data = self.compute_losses(batch, next_act, next_logp, weights)
        if losses.alpha is not None:
            self.alpha_opt.zero_grad(set_to_none=True)
            losses.alpha.backward()
            self.alpha_opt.step()
        metrics = losses.metrics() | {
            "q_data": q_data.mean().item(),
            "conservative_weight": self.conservative_weight(),
        }
        return losses.td + losses.conservative, metrics | {
            "loss_critic": (losses.td + losses.conservative).item()
        }

    def conservative_weight(self) -> float:
        if self.cfg.lagrangian_threshold is None:
            return self.cfg.conservative_weight
        return float(self.log_alpha.exp().clamp(0.0, 1e6).item() * self.cfg.conservative_weight)
