"""A study's stages as a checked plan: parsed from the config's ``stages:`` section, refused in one line
before any task runs when a reference, a cycle, a ``foreach`` or a type is wrong (docs/stages.md).

::

    stages:
      learn:  {workload: tesla, groups: [network=synthetic], config: {network: {T: 20}}}
      mrf:    {workload: network_mrf, in: {estimates: learn.estimates}}
      bounds: {workload: bounds, groups: [model=mrf], in: {model: mrf.mrf}, foreach: mrf.mrf}

``workload``: a pipeline name. ``groups``: Hydra group choices for the stage's config (``model=mrf``).
``config``: a nested dict merged onto the stage's composed config (``variational: {damping: 0.3}``).
``in``: ``{input: stage.output}``, the input ports the workload declares. ``foreach: stage.output``: one
instance per file of that ``npz_list`` output (its units); an input that names the same output receives
one unit. An input from a ``foreach`` stage goes to the instance with the same unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pgmflow.core.errors import ConfigError

STAGE_KEYS = ("workload", "groups", "config", "in", "foreach")


@dataclass(frozen=True)
class Ref:
    stage: str
    output: str

    def __str__(self):
        return f"{self.stage}.{self.output}"


@dataclass(frozen=True)
class StageDef:
    name: str
    workload: str
    groups: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)
    inputs: tuple[tuple[str, Ref], ...] = ()  # (input port, upstream output)
    foreach: Ref | None = None

    def upstream(self) -> set[str]:
        ups = {r.stage for _, r in self.inputs}
        return ups | ({self.foreach.stage} if self.foreach else set())


def _ref(where: str, text) -> Ref:
    if not isinstance(text, str) or text.count(".") != 1 or not all(text.split(".")):
        raise ConfigError(
            where, text, "must be STAGE.OUTPUT (an upstream stage's output)", f"set {where}=learn.estimates"
        )
    s, o = text.split(".")
    return Ref(s, o)


def _one(name: str, spec) -> StageDef:
    from pgmflow.core import registry

    where = f"stages.{name}"
    if not isinstance(spec, dict):
        raise ConfigError(
            where, spec, "must be a mapping with workload, groups, config, in, foreach", f"set {where}.workload=..."
        )
    for k in spec:
        if k not in STAGE_KEYS:
            raise ConfigError(f"{where}.{k}", spec[k], "unknown key of a stage", f"use {', '.join(STAGE_KEYS)}")
    wl = spec.get("workload")
    if wl not in registry.names():
        raise ConfigError(f"{where}.workload", wl, "no such workload", f"pick one of {', '.join(registry.names())}")
    groups = spec.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) and "=" in g for g in groups):
        raise ConfigError(
            f"{where}.groups", groups, "must be a list of GROUP=OPTION", f"set {where}.groups=[model=mrf]"
        )
    config = spec.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{where}.config", config, "must be a mapping of config sections", f"set {where}.config={{}}")
    ins = spec.get("in") or {}
    if not isinstance(ins, dict):
        raise ConfigError(f"{where}.in", ins, "must map input names to STAGE.OUTPUT", f"set {where}.in={{}}")
    inputs = tuple((str(k), _ref(f"{where}.in.{k}", v)) for k, v in ins.items())
    foreach = _ref(f"{where}.foreach", spec["foreach"]) if spec.get("foreach") else None
    return StageDef(name, wl, tuple(groups), config, inputs, foreach)


def _order(stages: dict[str, StageDef]) -> list[StageDef]:
    order, state = [], {}

    def visit(n, path):
        if state.get(n) == "done":
            return
        if state.get(n) == "open":
            cycle = " -> ".join([*path[path.index(n) :], n])
            raise ConfigError(
                f"stages.{n}", cycle, "the stages form a cycle", "make every `in:` point to an earlier stage"
            )
        state[n] = "open"
        for u in sorted(stages[n].upstream()):
            visit(u, [*path, n])
        state[n] = "done"
        order.append(stages[n])

    for n in stages:
        visit(n, [])
    return order


def _check_refs(s: StageDef, stages: dict[str, StageDef]):
    from pgmflow.core import registry

    decl = registry.get(s.workload).stage
    refs = [(f"stages.{s.name}.in.{port}", port, r) for port, r in s.inputs]
    if s.foreach:
        refs.append((f"stages.{s.name}.foreach", None, s.foreach))
    for where, port, r in refs:
        if r.stage not in stages:
            raise ConfigError(where, str(r), f"no stage named {r.stage!r}", f"pick one of {', '.join(stages)}")
        out = registry.get(stages[r.stage].workload).stage.output(r.output)
        if out is None:
            names = ", ".join(p.name for p in registry.get(stages[r.stage].workload).stage.outputs) or "none"
            raise ConfigError(where, str(r), f"stage {r.stage!r} has no output {r.output!r}", f"its outputs: {names}")
        if port is None:
            if out.kind != "npz_list":
                raise ConfigError(
                    where,
                    str(r),
                    f"foreach needs a list output (npz_list), not {out.kind}",
                    "iterate over an npz_list output",
                )
            continue
        inp = decl.input(port)
        if inp is None:
            names = ", ".join(p.name for p in decl.inputs) or "none"
            raise ConfigError(where, str(r), f"{s.workload} has no input {port!r}", f"its inputs: {names}")
        got = "npz" if (s.foreach == r and out.kind == "npz_list") else out.kind
        if got != inp.kind:
            raise ConfigError(
                where,
                str(r),
                f"{r} is {got} but {s.workload}'s input {port!r} takes {inp.kind}",
                "connect an output of the declared type",
            )
        up = stages[r.stage]
        if up.foreach is not None and up.foreach != s.foreach:
            raise ConfigError(
                where,
                str(r),
                f"{r.stage!r} runs once per unit of {up.foreach}",
                f"add foreach: {up.foreach} to stage {s.name!r}",
            )


def parse(section) -> list[StageDef]:
    """The stages in an order where each comes after its upstream stages (ConfigError on the first problem)."""
    if not isinstance(section, dict) or not section:
        raise ConfigError("stages", section, "must be a non-empty mapping of stage names", "see docs/stages.md")
    stages = {str(n): _one(str(n), spec) for n, spec in section.items()}
    for s in stages.values():  # names first, then cycles, then outputs and types
        refs = [(f"stages.{s.name}.in.{p}", r) for p, r in s.inputs]
        refs += [(f"stages.{s.name}.foreach", s.foreach)] if s.foreach else []
        for where, r in refs:
            if r.stage not in stages:
                raise ConfigError(where, str(r), f"no stage named {r.stage!r}", f"pick one of {', '.join(stages)}")
    order = _order(stages)
    for s in order:
        _check_refs(s, stages)
    return order
