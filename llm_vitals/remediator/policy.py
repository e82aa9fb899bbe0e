"""The remediator's policy: the gate's `GatePolicy` (with every timeout the gate's plan needs) and its
`TemplateMatch`es, read from its settings, and which template and pre_restart a target gets. Pure:
settings and the exporter's view in, values out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from .fleet_limit import percent_of
from .model import TargetStatus
from .settings import PreRestart, Settings, TargetTemplate

__all__ = ["DEFAULT_POD_TIMEOUT", "GatePolicy", "TemplateMatch", "policy_from", "pre_restart_of", "pre_restart_planned",
           "restart_timeout", "template_index", "template_of"]

# A pod restart's timeout when neither a template nor a target names one.
DEFAULT_POD_TIMEOUT = 30.0


@dataclass(frozen=True)
class TemplateMatch:
    """Which discovered targets a `target_templates:` entry takes; every field set must match."""

    engine: str | None = None
    namespace: str | None = None
    name: str | None = None  # a glob over the target's name
    timeout: float = DEFAULT_POD_TIMEOUT  # the pod restart's (the template's `timeout`)
    pre_restart_timeout: float = 0.0  # its pre_restart command's, when it has one

    def matches(self, name: str, status: TargetStatus) -> bool:
        return (
            (self.engine is None or status.engine == self.engine)
            and (self.namespace is None or status.namespace == self.namespace)
            and (self.name is None or fnmatchcase(name, self.name))
        )


@dataclass(frozen=True)
class GatePolicy:
    targets: frozenset[str]
    global_cooldown: float
    max_restarts: int
    budget_window: float
    max_unhealthy: int
    dry_run: bool = False
    down_alertnames: frozenset[str] = frozenset({"LLMServerDown"})
    # With templates, the fleet is the static targets plus the exporter's targets they match,
    # and a percentage `max_unhealthy` is taken of that count at decision time.
    templates: tuple[TemplateMatch, ...] = ()
    max_unhealthy_percent: float | None = None
    storm_cooldown: float = 0.0
    gpu_fault_action: str = "refuse"  # refuse | cordon_and_move
    # The ladder: the next step for a workload stuck again within this many seconds; None = off.
    escalate_within: float | None = None
    # Nodes llm-vitals may hold cordoned at once (unreleased), fleet-wide; a further cordon is refused
    # `cordon_limit`. 0: never cordon.
    max_cordoned_nodes: int = 1
    # The per-workload backoff: after the n-th restart of a streak, the next waits
    # min(backoff_initial * 2**(n-1), backoff_max); backoff_reset without a restart ends the streak.
    # backoff_initial 0: off.
    backoff_initial: float = 900.0
    backoff_max: float = 4 * 3600.0
    backoff_reset: float = 12 * 3600.0
    # Static targets' executor timeouts and their pre_restart timeouts (a target not named: 30 s, none).
    target_timeouts: Mapping[str, float] = field(default_factory=dict)
    pre_restart_timeouts: Mapping[str, float] = field(default_factory=dict)


def template_index(policy: GatePolicy, name: str, status: TargetStatus | None) -> int | None:
    """The first template taking a target the exporter reports, or None."""
    if status is None:
        return None
    return next((i for i, t in enumerate(policy.templates) if t.matches(name, status)), None)


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
    index = template_index(policy, target, status) if target not in policy.targets else None
    return settings.target_templates[index] if index is not None else None


def pre_restart_planned(settings: Settings, target: str, template: int | None) -> PreRestart | None:
    """The command to run (and journal) before a planned restart (its `Plan`'s target and template):
    the static target's, else its template's."""
    config = settings.targets.get(target)
    if config is not None:
        return config.pre_restart
    return settings.target_templates[template].pre_restart if template is not None else None


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
