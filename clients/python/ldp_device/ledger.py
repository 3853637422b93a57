"""The lifetime privacy budget of one device: its ledger and the rules of ``producers/sdk.py``.

The rule is built so that what the server sees of a device, *which* scheduled reports arrive and which are
refused, depends only on the device's schedule and configuration, never on its values.

* **Actual loss** (:meth:`Ledger.loss`): per memoizing attribute ``proto.longitudinal_loss(memoized count)``,
  per memoryless one ``reports x eps_first``, per group the solution's loss of the inputs memoized from real
  data (longitudinal solutions) or its reservation (single-shot ones). Value-dependent: no visible decision is
  ever taken on it.
* **Reserved loss** (:meth:`Ledger.reserved`): each report of a memoizing attribute reserves one more *memo
  slot* (while it has fewer than ``memo_size`` and the reservation fits the budget), each memoryless report
  ``eps_first``, each group step the solution's worst case after one more step. Schedule-only, and it bounds
  the actual loss: ``privacy_loss <= reserved_loss <= budget_eps``.
* **Freezing**: a memoizing attribute whose new value cannot be memoized reports, on schedule, the value it
  last reported (memoized) instead. **Refusals** (:class:`~ldp_device.errors.BudgetExceeded`) only on the
  reserved loss: a memoryless report that does not fit, the first report of a memoizing attribute whose first
  slot does not fit, a group step that does not fit.
* A budget that cannot memoize one value of some memoizing attribute is refused when the device is built.
"""
from __future__ import annotations

import math
from typing import Any

from .base import MemoState
from .campaign import Campaign
from .solutions import MultiState

__all__ = ["TOL", "LEDGER_KEYS", "budget_plan", "Ledger"]

TOL = 1e-9
LEDGER_KEYS = ("spent_reports", "memo_slots", "last_values", "group_reports")


def budget_plan(campaign: Campaign, budget_eps: float | None) -> str:
    """What a lifetime budget allows on ``campaign``'s attributes, and why (``producers.sdk.budget_plan``, the
    same text): each memoizing attribute's first and further memo slots, how many values it could memoize
    alone, each memoryless report's cost, and how many values the budget memoizes when they report in turn."""
    if budget_eps is None:
        return "no lifetime budget: every memoizing attribute memoizes up to its memo_size values"
    lines = [f"lifetime budget ε = {budget_eps:g}:"]
    memoizing: list[tuple[str, Any]] = []
    for name in campaign.ungrouped:
        proto = campaign.attributes[name].protocol
        if not proto.memo_size:
            lines.append(f"  {name} ({proto.name}, memoryless): every report spends ε1 = {float(proto.eps_first):.4g}")
            continue
        memoizing.append((name, proto))
        first = float(proto.longitudinal_loss(1))
        alone = max((m for m in range(1, proto.memo_size + 1)
                     if float(proto.longitudinal_loss(m)) <= budget_eps + TOL), default=0)
        more = float(proto.longitudinal_loss(2)) - first if proto.memo_size > 1 else 0.0
        lines.append(f"  {name} ({proto.name}): its first memoized value reserves {first:.4g}, each further one "
                     f"{more:.4g}; alone in the budget it could memoize {alone} of its {proto.memo_size} possible "
                     "inputs")
    for g in campaign.groups.values():
        lines.append(f"  group {g.name} ({g.solution.name}): every group step reserves its solution's worst-case loss")
    if memoizing:
        slots = {name: 0 for name, _ in memoizing}
        reserved, open_ = 0.0, [name for name, _ in memoizing]
        protos = dict(memoizing)
        while open_:
            for name in list(open_):
                p, m = protos[name], slots[name]
                cost = float(p.longitudinal_loss(m + 1)) - float(p.longitudinal_loss(m)) if m < p.memo_size \
                    else math.inf
                if reserved + cost > budget_eps + TOL:
                    open_.remove(name)
                    continue
                reserved, slots[name] = reserved + cost, m + 1
        lines.append("  reporting in turn, the memoizing attributes memoize "
                     + ", ".join(f"{n} {slots[n]}" for n in slots)
                     + f" value(s) ({sum(slots.values())} reports reserve {reserved:.4g}); every report of a memoizing "
                       "attribute reserves a slot whether or not its value changed, and an attribute whose slots are "
                       "used freezes on its last value (reports go on)")
    return "\n".join(lines)


def _report_hex(v: str) -> str:
    """A ledger's recorded report: lowercase hex digits of whole bytes (``ValueError`` otherwise)."""
    if not v or len(v) % 2 or v.strip("0123456789abcdef"):
        raise ValueError(f"a ledger string is not the hex of a report: {v!r}")
    return v


class Ledger:
    """One device's ledger over a campaign and the state it accounts for.

    ``spent_reports`` (memoryless attribute -> reports), ``memo_slots`` (memoizing attribute -> slots reserved),
    ``last_values`` (memoizing attribute -> value last reported: what it freezes on; a numeric attribute's is its
    measurement, a float), ``group_reports`` (group
    -> steps reserved), ``keyed`` (scope -> id of the key that reported), ``retired`` (scope -> loss of the keys
    its resets retired), ``recorded`` (scope -> its reserved loss at the last write: counted once the scope
    leaves the campaign). Scopes are ``a:<attribute>`` (ungrouped) and ``g:<group>``.
    """

    def __init__(self, campaign: Campaign, budget_eps: float | None) -> None:
        self.campaign = campaign
        self.budget_eps = budget_eps
        self.spent_reports: dict[str, int] = {}
        self.memo_slots: dict[str, int] = {}
        self.last_values: dict[str, int | float] = {}
        self.group_reports: dict[str, int] = {}
        self.keyed: dict[str, str] = {}
        self.retired: dict[str, float] = {}
        self.recorded: dict[str, float] = {}
        self.states: dict[str, MemoState | None] = {}      # ungrouped attribute -> memo state (None: memoryless)
        self.group_states: dict[str, MultiState] = {}
        self.broken: dict[str, str] = {}                    # scope -> why it cannot report
        self.changed_scopes: set[str] = set()               # scopes whose protocol changed after they reported

    # ------------------------------------------------------------------ persistence
    def data(self) -> dict[str, Any]:
        return {"campaign": self.campaign.id, "spent_reports": self.spent_reports, "memo_slots": self.memo_slots,
                "last_values": self.last_values, "group_reports": self.group_reports, "keyed": self.keyed,
                "retired": self.retired, "recorded": self.recorded}

    @staticmethod
    def parse(data: Any) -> dict[str, Any]:
        """The ledger fields of a ``budget.json`` value (``ValueError``/``TypeError``/... if malformed)."""
        out: dict[str, Any] = {key: {str(k): int(v) for k, v in data.get(key, {}).items()}
                               for key in LEDGER_KEYS if key != "last_values"}
        # a numeric attribute's last value is a measurement: kept as written (a float), an index as an int, a
        # memoizing open-domain attribute's the hex of its memoized report (never the value: producers/sdk.py)
        out["last_values"] = {str(k): v if isinstance(v, float) else _report_hex(v) if isinstance(v, str) else int(v)
                              for k, v in data.get("last_values", {}).items()}
        out["keyed"] = {str(k): str(v) for k, v in data.get("keyed", {}).items()}
        out["retired"] = {str(k): float(v) for k, v in data.get("retired", {}).items()}
        out["recorded"] = {str(k): float(v) for k, v in data.get("recorded", {}).items()}
        return out

    def set(self, data: dict[str, Any]) -> None:
        self.spent_reports, self.memo_slots, self.last_values, self.group_reports = (
            dict(data[k]) for k in LEDGER_KEYS)
        self.keyed, self.retired, self.recorded = dict(data["keyed"]), dict(data["retired"]), dict(data["recorded"])

    def scopes(self) -> dict[str, str]:
        """Every scope of the campaign -> its fingerprint."""
        out = {f"a:{n}": self.campaign.attributes[n].protocol.fingerprint for n in self.campaign.ungrouped}
        out.update({f"g:{g.name}": g.solution.fingerprint for g in self.campaign.groups.values()})
        return out

    def record(self) -> None:
        """Record each current scope's reserved loss (it stays counted once the scope is removed or changed)."""
        rec = dict(self.recorded)
        for scope in self.scopes():
            if scope not in self.changed_scopes:
                kind, name = scope.split(":", 1)
                rec[scope] = self.attr_reserved(name) if kind == "a" else self.group_reserved(name)
        self.recorded = rec

    def used(self, scope: str) -> bool:
        """True once the scope has reported (its loss is in the ledger)."""
        kind, name = scope.split(":", 1)
        if scope in self.keyed:
            return True
        if kind == "a":
            return self.spent_reports.get(name, 0) > 0 or self.memo_slots.get(name, 0) > 0
        return self.group_reports.get(name, 0) > 0

    # ------------------------------------------------------------------ accounting
    def fits(self, spent: float, cost: float) -> bool:
        return self.budget_eps is None or spent + cost <= self.budget_eps + TOL

    def slots(self, name: str) -> int:
        """Memo slots of a memoizing attribute (at least its memoized count)."""
        st = self.states.get(name)
        if st is None:
            return self.memo_slots.get(name, 0)
        count = self.campaign.attribute(name).protocol.memoized_count(st)  # inf: no tag table (refused)
        return self.memo_slots.get(name, 0) if math.isinf(count) else max(self.memo_slots.get(name, 0), count)

    def slot_cost(self, name: str, slots: int) -> float | None:
        """Reserved loss one more memo slot adds (``None``: the attribute has all its slots)."""
        proto = self.campaign.attribute(name).protocol
        if slots >= proto.memo_size:
            return None
        return float(proto.longitudinal_loss(slots + 1)) - float(proto.longitudinal_loss(slots))

    def group_steps(self, group: str) -> int:
        st = self.group_states.get(group)
        if st is None:
            return self.group_reports.get(group, 0)
        return max(self.group_reports.get(group, 0), max(st.reported) if st.reported else 0)

    def group_bound(self, group: str, steps: int) -> float:
        """Reserved loss of ``steps`` group steps: the solution's worst case (schedule only)."""
        sol = self.campaign.groups[group].solution
        if steps <= 0:
            return 0.0
        if sol.longitudinal:
            return float(sol.loss_bound(steps))
        return steps * float(sol.eps_first)

    def version_reserved(self, scope: str) -> float:
        kind, name = scope.split(":", 1)
        if scope in self.changed_scopes:
            return self.recorded.get(scope, 0.0) - self.retired.get(scope, 0.0)
        if kind == "g":
            return self.group_bound(name, self.group_steps(name))
        proto = self.campaign.attribute(name).protocol
        if proto.memo_size == 0:
            return self.spent_reports.get(name, 0) * float(proto.eps_first)
        return float(proto.longitudinal_loss(self.slots(name)))

    def attr_reserved(self, name: str) -> float:
        return self.version_reserved(f"a:{name}") + self.retired.get(f"a:{name}", 0.0)

    def group_reserved(self, group: str) -> float:
        return self.version_reserved(f"g:{group}") + self.retired.get(f"g:{group}", 0.0)

    def gone_loss(self) -> float:
        scopes = self.scopes()
        return float(sum(v for k, v in self.recorded.items() if k not in scopes))

    def reserved(self, attribute: str | None = None, group: str | None = None) -> float:
        if attribute is not None:
            return self.attr_reserved(attribute)
        if group is not None:
            return self.group_reserved(group)
        return float(sum(self.attr_reserved(n) for n in self.campaign.ungrouped)
                     + sum(self.group_reserved(g) for g in self.campaign.groups) + self.gone_loss())

    def attr_loss(self, name: str) -> float:
        proto = self.campaign.attribute(name).protocol
        st = self.states.get(name)
        if f"a:{name}" in self.broken:
            return self.attr_reserved(name)
        retired = self.retired.get(f"a:{name}", 0.0)
        if st is None:
            return self.spent_reports.get(name, 0) * float(proto.eps_first) + retired
        return float(proto.longitudinal_loss(proto.memoized_count(st))) + retired

    def group_loss(self, group: str) -> float:
        sol = self.campaign.groups[group].solution
        st = self.group_states.get(group)
        if sol.longitudinal and st is not None and f"g:{group}" not in self.broken:
            return float(sol.longitudinal_loss(st)) + self.retired.get(f"g:{group}", 0.0)
        return self.group_reserved(group)

    def loss(self, attribute: str | None = None, group: str | None = None) -> float:
        if attribute is not None:
            return self.attr_loss(attribute)
        if group is not None:
            return self.group_loss(group)
        return float(sum(self.attr_loss(n) for n in self.campaign.ungrouped)
                     + sum(self.group_loss(g) for g in self.campaign.groups) + self.gone_loss())
