"""When to checkpoint: Young/Daly's interval from the job's own rate of interruptions.

A checkpoint every T seconds, each holding training C seconds, on a job that loses what it
trained since its last checkpoint at a rate of lambda per second, spends about C / T of its
time saving and lambda * T / 2 training again; T = sqrt(2 C / lambda) spends least (Young
1974; Daly 2006 shows it within a few percent of the optimum while C is small next to
1 / lambda). Only interruptions that lose work count: a spot reclaim whose 2-minute notice
the script checkpoints at (a PreemptionFlag) loses nothing, whatever the interval.

Two parts know one half each. The controller knows lambda: at each attempt's start it passes
the nodes `TRAINCTL_CHECKPOINT_POLICY` (`CheckpointPolicy`), the job's rate of interruptions
that lost work, per node-hour, from its own history shrunk toward its market's assumed rate
by one pseudo-interruption (`policy_for`); a new attempt is what every interruption brings,
so the rate is new whenever it changes. The node knows C, from its own saves, and whether it
saves at a notice: `Checkpointer.due()` takes the interval from both.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

__all__ = [
    "ASSUMED_SAVE_SECONDS",
    "CheckpointPolicy",
    "DEFAULT_INTERVAL_SECONDS",
    "FAILURES_PER_NODE_HOUR",
    "POLICY_ENV",
    "SPOT_RECLAIMS_PER_NODE_HOUR",
    "policy_for",
    "young_daly_seconds",
]

POLICY_ENV = "TRAINCTL_CHECKPOINT_POLICY"
# Assumed where a job has no history: a spot instance is reclaimed once in 5 months of
# instance-hours (the Spot Instance Advisor's worst band: more than 20 % of instances a month),
# and any instance fails without notice 20x less often.
SPOT_RECLAIMS_PER_NODE_HOUR = 0.2 / (30 * 24)
FAILURES_PER_NODE_HOUR = 0.01 / (30 * 24)
# A save's hold on the loop before the node has measured one (trainctl estimate's default).
ASSUMED_SAVE_SECONDS = 5.0
# Outside trainctl (no policy passed): every 30 minutes.
DEFAULT_INTERVAL_SECONDS = 1800.0


def young_daly_seconds(save_seconds: float, interruptions_per_hour: float) -> float:
    """The checkpoint interval that loses least to interruptions at this rate (the whole
    job's), each save holding training `save_seconds`: sqrt(2 * C * MTBF)."""
    if interruptions_per_hour <= 0:
        return math.inf
    return math.sqrt(2 * save_seconds * 3600.0 / interruptions_per_hour)


@dataclass(frozen=True)
class CheckpointPolicy:
    """What the controller tells a job's nodes about interruptions (see the module)."""

    nodes: int
    # Interruptions that lose work per node-hour: for a script that checkpoints at a reclaim's
    # notice, and for one that does not (a spot attempt's reclaims count then).
    lossy_per_node_hour_saved: float
    lossy_per_node_hour_unsaved: float
    source: str  # where the rate comes from, in words

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, value: str | None = None) -> CheckpointPolicy | None:
        """The policy the controller passed (None: none, or not one this version reads)."""
        value = os.environ.get(POLICY_ENV) if value is None else value
        if not value:
            return None
        try:
            fields = json.loads(value)
            policy = cls(
                nodes=max(1, int(fields["nodes"])),
                lossy_per_node_hour_saved=float(fields["lossy_per_node_hour_saved"]),
                lossy_per_node_hour_unsaved=float(fields["lossy_per_node_hour_unsaved"]),
                source=str(fields.get("source", "")),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return policy

    def interruptions_per_hour(self, *, saves_at_notice: bool) -> float:
        """The whole job's rate of interruptions that lose work."""
        per_node = (
            self.lossy_per_node_hour_saved if saves_at_notice else self.lossy_per_node_hour_unsaved
        )
        return per_node * self.nodes

    def interval_seconds(
        self, save_seconds: float | None, *, saves_at_notice: bool, write_seconds: float = 0.0
    ) -> float:
        """Young/Daly's interval for a save holding training `save_seconds` (None: not
        measured yet, ASSUMED_SAVE_SECONDS); never shorter than a save's background write
        (`write_seconds`: one save is in flight at a time)."""
        hold = save_seconds if save_seconds is not None and save_seconds > 0 else None
        rate = self.interruptions_per_hour(saves_at_notice=saves_at_notice)
        optimum = young_daly_seconds(hold or ASSUMED_SAVE_SECONDS, rate)
        return max(optimum, write_seconds)


def policy_for(history: list[tuple[float, bool]], *, nodes: int, spot: bool) -> CheckpointPolicy:
    """The policy for an attempt on `nodes` nodes (`spot`: bought on the spot market), from
    the job's `history`: each earlier attempt's node-hours and whether an interruption ended
    it losing work. The rate is the Gamma-Poisson posterior mean with one pseudo-interruption
    at the market's assumed rate: the assumed rate with no history, the job's own once its
    node-hours outweigh the prior's."""
    hours = sum(h for h, _ in history)
    lossy = sum(1 for _, lost in history if lost)

    def posterior(prior: float) -> float:
        return (lossy + 1) / (hours + 1 / prior)

    unsaved = FAILURES_PER_NODE_HOUR + (SPOT_RECLAIMS_PER_NODE_HOUR if spot else 0.0)
    source = (
        f"the job's {lossy} interruption(s) that lost work in {hours:,.1f} node-hours, "
        "with one assumed"
        if history
        else "assumed for " + ("spot capacity" if spot else "capacity that is not reclaimed")
    )
    return CheckpointPolicy(
        nodes=max(1, nodes),
        lossy_per_node_hour_saved=posterior(FAILURES_PER_NODE_HOUR),
        lossy_per_node_hour_unsaved=posterior(unsaved),
        source=source,
    )
