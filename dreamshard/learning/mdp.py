"""The estimated MDP: placing a task's tables one by one, with states and rewards from the cost network.

State: the tables on each device so far (summed encodings) and their predicted costs.
Action: the device for the next table, among those with room. Tables come in
descending order of their predicted single-table cost. Reward at the end: minus the
cost network's predicted plan cost. No kernel runs, so episodes cost microseconds.
An episode that reaches a table no device has room for ends with DEAD_END_PENALTY times
the worst cost of its batch.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dreamshard.hardware.comm import shard_traffic
from dreamshard.learning.cost_model import CostNet, DeviceLinks, folded_encodings
from dreamshard.learning.features import FeatureScaler, table_features
from dreamshard.learning.policy import PolicyNet
from dreamshard.placement import Rules
from dreamshard.tasks import Task

DEAD_END_PENALTY = 2.0
# Logits this close (relative to their size, 1 at least) are one choice: the greedy step takes the lowest device
# index among them, here and in the NumPy decoders (decoding.rank_devices). Devices in the same state (all empty
# at the first step) tie exactly in exact arithmetic, but PyTorch's float32 (training's greedy rollout) and
# NumPy's float64 (planning) round such logits apart, and processors round them differently, so the rollout and
# the planner could break one tie to different devices.
LOGIT_TIE = 1e-5


@dataclass(frozen=True)
class TaskContext:
    """What episodes of one task need, computed once."""

    task: Task
    x: torch.Tensor  # [T, 21] scaled features
    cost_enc: torch.Tensor  # [T, W] cost-network encodings (CostNet.encode)
    order: list[int]  # placement order: predicted single-table cost, descending
    sizes: torch.Tensor  # [T] bytes
    capacity: torch.Tensor  # [D] bytes
    allowed: torch.Tensor  # [T, D] bool: the devices each table may take (placement.Rules: pins, avoid lists)
    widths: torch.Tensor  # [T, 2] a table's traffic per sample: output elements, input bytes (comm.shard_traffic)
    cluster: DeviceLinks  # the devices' speeds and links, for the cost network's estimates

    @classmethod
    def build(cls, task: Task, cost_net: CostNet, scaler: FeatureScaler,
              kinds: Sequence[int] | None = None) -> TaskContext:
        """`kinds`: each of the task's tables' lookup group (plan.LOOKUP_KINDS index) where they are pieces of
        tables cut (sharders/cuts.py); None: whole tables."""
        x, enc = folded_encodings(cost_net, scaler, table_features(task.tables, task.memory), kinds)
        with torch.no_grad():
            single = cost_net.head_costs(enc)[:, :2].sum(dim=-1).numpy()
        order = sorted(range(len(task.tables)), key=lambda i: (-single[i], i))
        sizes, capacity, allowed = rules_tensors(Rules.of_task(task))
        widths = torch.tensor([shard_traffic(t, t.dim, topology=cost_net.config.topology) for t in task.tables],
                              dtype=torch.float32).reshape(-1, 2)
        return cls(task, x, enc, order, sizes, capacity, allowed, widths,
                   DeviceLinks.of(cost_net.config, task.speeds(), task.host_ids()))


@dataclass
class Episodes:
    assignment: torch.Tensor  # [B, T] device of each table
    log_prob: torch.Tensor  # [B] sum over steps (differentiable)
    entropy: torch.Tensor  # [B] sum over steps (differentiable)
    predicted_ms: torch.Tensor  # [B] predicted plan cost (no gradient)
    dead: torch.Tensor  # [B] bool: ran out of room


def rules_tensors(rules: Rules) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The placement rules as a batched rollout reads them: items' bytes [T] and devices' capacity [D] (float64),
    and the devices each item may take [T, D] (groups aside: training tasks have none; decoding places through
    placement.place_tables, which keeps them)."""
    allowed = np.stack([rules.mask(i) for i in range(len(rules.sizes))]) if len(rules.sizes) else \
        np.zeros((0, rules.num_devices), dtype=bool)
    return (torch.from_numpy(rules.sizes.astype(np.float64)), torch.from_numpy(rules.capacity.astype(np.float64)),
            torch.from_numpy(allowed))


def greedy_devices(logits: torch.Tensor) -> torch.Tensor:
    """[B] the best device of each row of `logits` [B, D] (-inf: not legal), ties within LOGIT_TIE to the lowest
    index."""
    best = logits.max(dim=1, keepdim=True).values
    near = logits >= best - LOGIT_TIE * (1 + best.abs())
    return near.to(torch.int8).argmax(dim=1)  # the first of the maximal values: the lowest index among the near


def choose(logits: torch.Tensor, legal: torch.Tensor, greedy: bool, generator: torch.Generator | None,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One placement step of a batch of episodes, for every policy that places tables one by one: a device per
    episode among the `legal` ones ([B, D] bool), sampled from softmax(`logits`) or (greedy) the best one.

    Returns the action [B], its log-probability [B], the step's entropy [B] (0 where one device was legal) and
    `stuck` [B]: episodes with no legal device, which continue (on any device) only to keep the batch shape."""
    stuck = ~legal.any(dim=1)
    legal = legal | stuck[:, None]
    logits = logits.masked_fill(~legal, -torch.inf)
    dist = torch.distributions.Categorical(logits=logits)
    action = greedy_devices(logits) if greedy else torch.multinomial(dist.probs, 1, generator=generator).squeeze(1)
    entropy = torch.where(legal.sum(1) > 1, dist.entropy(), torch.zeros(len(action)))
    return action, dist.log_prob(action), entropy, stuck


def rollout(policy: PolicyNet, cost_net: CostNet, ctx: TaskContext, batch: int,
            generator: torch.Generator | None = None, greedy: bool = False) -> Episodes:
    """Run `batch` episodes of ctx.task at once on the estimated MDP."""
    n_dev = ctx.task.num_devices
    embed = ctx.cost_enc.shape[-1]
    policy_enc = policy.encode(ctx.x)
    dev_cost = torch.zeros(batch, n_dev, embed)
    dev_policy = torch.zeros(batch, n_dev, policy_enc.shape[-1])
    used = torch.zeros(batch, n_dev, dtype=torch.float64)
    dims = torch.zeros(batch, n_dev, 2)  # each device's traffic
    dead = torch.zeros(batch, dtype=torch.bool)
    assignment = torch.full((batch, len(ctx.order)), -1, dtype=torch.long)
    log_prob = torch.zeros(batch)
    entropy = torch.zeros(batch)
    for t in ctx.order:
        with torch.no_grad():
            costs = cost_net.device_costs(dev_cost, dims, ctx.cluster)
        logits = policy.logits(dev_policy, costs, policy_enc[t].expand(batch, -1))
        legal = (used + ctx.sizes[t] <= ctx.capacity) & ctx.allowed[t]
        action, step_log_prob, step_entropy, stuck = choose(logits, legal, greedy, generator)
        dead |= stuck
        log_prob = log_prob + step_log_prob
        entropy = entropy + step_entropy
        onehot = torch.nn.functional.one_hot(action, n_dev)
        dev_cost = dev_cost + onehot[..., None] * ctx.cost_enc[t]
        dev_policy = dev_policy + onehot[..., None] * policy_enc[t]
        used = used + onehot * ctx.sizes[t]
        dims = dims + onehot[..., None] * ctx.widths[t]
        assignment[:, t] = action
    with torch.no_grad():
        predicted = cost_net.plan_cost(dev_cost, dims, ctx.cluster)
    return Episodes(assignment, log_prob, entropy, predicted, dead)


def reinforce_loss(episodes: Episodes, cost_ms: torch.Tensor, entropy_weight: float,
                   baseline_ms: float | None = None) -> torch.Tensor:
    """REINFORCE with a baseline, plus an entropy bonus.

    `cost_ms` [B] is what the episodes cost (predicted on the estimated MDP, measured for
    AutoShard); dead ends get DEAD_END_PENALTY x the batch's worst cost. The advantage of an
    episode is (baseline - cost) / the batch's standard deviation; the baseline is `baseline_ms`
    (e.g. the policy's greedy plan: self-critical) or, where None, the batch's mean.
    """
    cost = cost_ms.detach().clone().float()
    alive = ~episodes.dead
    worst = cost[alive].max() if alive.any() else torch.tensor(1.0)
    cost[episodes.dead] = DEAD_END_PENALTY * worst
    if len(cost) < 2:
        return -entropy_weight * episodes.entropy.mean()
    base = cost.mean() if baseline_ms is None else torch.tensor(float(baseline_ms))
    adv = (base - cost) / (cost.std() + 1e-8)
    return -(adv * episodes.log_prob).mean() - entropy_weight * episodes.entropy.mean()
