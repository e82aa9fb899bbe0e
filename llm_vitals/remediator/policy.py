"""The remediator's policy, read from its settings: the gate's `GatePolicy` (with every timeout the
gate's plan needs), and which template and pre_restart a target gets. Pure: settings and the
exporter's view in, values out."""

from __future__ import annotations

from . import gate
from .fleet_limit import percent_of
from .gate import DEFAULT_POD_TIMEOUT, GatePolicy, Plan, TemplateMatch
from .model import TargetStatus
from .settings import PreRestart, Settings, TargetTemplate

__all__ = ["DEFAULT_POD_TIMEOUT", "policy_from", "pre_restart_of", "pre_restart_planned", "restart_timeout",
           "template_of"]


def policy_from(settings: Settings) -> GatePolicy:
    """The gate's policy; `max_unhealthy` as a count of the static targets and, when it is a
    percentage, that percentage too (the gate takes it again of the fleet the templates make)."""
    return GatePolicy(
        targets=frozenset(settings.targets),
        global_cooldown=settings.global_cooldown,
        max_restarts=settings.budget.max_restarts,
        budget_window=settings.budget.window,
        max_unhealthy=settings.max_unhealthy_count(),
        dry_run=settings.dry_run,
        down_alertnames=frozenset(settings.down_alertnames),
        templates=tuple(
            TemplateMatch(engine=t.match.engine, namespace=t.match.namespace, name=t.match.name,
                          timeout=float(t.timeout), pre_restart_timeout=t.pre_restart.timeout if t.pre_restart else 0.0)
            for t in settings.target_templates
        ),
        max_unhealthy_percent=percent_of(settings.max_unhealthy),
        storm_cooldown=settings.storm_cooldown,
        gpu_fault_action=settings.gpu_fault_action,
        escalate_within=settings.escalate_within,
        max_cordoned_nodes=settings.max_cordoned_nodes,
        backoff_initial=settings.budget.backoff.initial,
        backoff_max=settings.budget.backoff.max,
        backoff_reset=settings.budget.backoff.reset_after,
        target_timeouts={name: float(t.timeout) for name, t in settings.targets.items()},
        pre_restart_timeouts={name: t.pre_restart.timeout for name, t in settings.targets.items() if t.pre_restart},
    )


def template_of(settings: Settings, policy: GatePolicy, target: str, status: TargetStatus | None) -> TargetTemplate | None:
    """The `target_templates:` entry that takes a target the exporter reports; None for a static target."""
    index = gate.template_index(policy, target, status) if target not in policy.targets else None
    return settings.target_templates[index] if index is not None else None


def pre_restart_planned(settings: Settings, plan: Plan) -> PreRestart | None:
    """The command to run (and journal) before the planned restart: the static target's, else its template's."""
    config = settings.targets.get(plan.target)
    if config is not None:
        return config.pre_restart
    return settings.target_templates[plan.template].pre_restart if plan.template is not None else None


def pre_restart_of(settings: Settings, policy: GatePolicy, target: str, status: TargetStatus | None) -> PreRestart | None:
    """The command to run (and journal) before the target's restart: its own, else its template's."""
    config = settings.targets.get(target)
    if config is not None:
        return config.pre_restart
    template = template_of(settings, policy, target, status)
    return template.pre_restart if template else None


def restart_timeout(settings: Settings, policy: GatePolicy, target: str, status: TargetStatus | None) -> float:
    """How long the target's restart may take: its executor's timeout, else its template's."""
    config = settings.targets.get(target)
    if config is not None:
        return float(config.timeout)
    template = template_of(settings, policy, target, status)
    return float(template.timeout) if template else DEFAULT_POD_TIMEOUT
