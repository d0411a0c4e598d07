"""A PID-controlled Lagrange multiplier for a cost constraint ``J_c <= limit``.

Stooke, Achiam and Abbeel, "Responsive Safety in Reinforcement Learning by PID Lagrangian Methods"
(ICML 2020). Plain gradient ascent on the multiplier is the special case ``kp = kd = 0``, ``ki = lr``.
The state (integral, previous measurement, multiplier) is checkpointed with its stage, and a resumed run
restores it; a new stage starts afresh, since each stage's multiplier measures its own signal (offline
the cost critic's value at the data's episode starts, online the episodes' cost against the budget).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PIDConfig:
    kp: float = 0.0
    """Proportional gain: reacts to the current violation."""
    ki: float = 0.01
    """Integral gain: with kp = kd = 0 this is gradient ascent with learning rate ki."""
    kd: float = 0.0
    """Derivative gain: reacts to a rising cost before the violation accumulates."""
    init: float = 0.0
    max_value: float = 1000.0


class PIDLagrangian:
    def __init__(self, cfg: PIDConfig = PIDConfig()):
        self.cfg = cfg
        self.integral = cfg.init
        self.prev = 0.0
        self.value = cfg.init

    def update(self, measured: float, limit: float) -> float:
        """One controller step from a measurement of the constrained quantity; returns the multiplier."""
        c = self.cfg
        error = measured - limit
        self.integral = max(0.0, self.integral + c.ki * error)
        derivative = max(0.0, measured - self.prev)
        self.prev = measured
        self.value = min(c.max_value, max(0.0, c.kp * error + self.integral + c.kd * derivative))
        return self.value

    def state(self) -> dict[str, float]:
        return {"integral": self.integral, "prev": self.prev, "value": self.value}

    def load_state(self, s: dict[str, float]) -> None:
        self.integral, self.prev, self.value = float(s["integral"]), float(s["prev"]), float(s["value"])
