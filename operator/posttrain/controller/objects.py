"""The objects the controller reconciles, parsed once from the API server's dicts into posttrain.api's
models. Rendering and status derivation read these typed values only; a spec the models refuse is a
SpecError naming the field (the job fails with reason InvalidSpec).

A status stays the dict the API server holds (camelCase): it is what every merge patch is computed
against, field by field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from posttrain.api.resources import API_VERSION, RLJobSpec, SFTJobSpec, TaskAppSpec, parse_spec, plural
from posttrain.controller.safejson import MAX_DEPTH, undecodable
from posttrain.controller.spec_errors import SpecError, spec_error


@dataclass(frozen=True)
class Owner:
    """Who a child belongs to: its name, labels and ownerReferences are made from this."""

    kind: str  # RLJob, SFTJob or TaskApp
    name: str
    namespace: str
    uid: str
    generation: int = 1
    api_version: str = API_VERSION

    @property
    def plural(self) -> str:
        return plural(self.kind)

    def reference(self) -> dict[str, Any]:
        """The object as Events name it."""
        meta = {"name": self.name, "namespace": self.namespace, "uid": self.uid}
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta}


@dataclass(frozen=True)
class Job:
    """An RLJob or SFTJob."""

    owner: Owner
    spec: RLJobSpec | SFTJobSpec
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def is_rl(self) -> bool:
        return isinstance(self.spec, RLJobSpec)

    @property
    def trainer_kind(self) -> str:
        """What the trainer runs: rl or sft."""
        return "rl" if self.is_rl else "sft"

    @property
    def rl(self) -> RLJobSpec:
        assert isinstance(self.spec, RLJobSpec), f"{self.owner.kind} {self.owner.name} is not an RLJob"
        return self.spec

    @property
    def sft(self) -> SFTJobSpec:
        assert isinstance(self.spec, SFTJobSpec), f"{self.owner.kind} {self.owner.name} is not an SFTJob"
        return self.spec


@dataclass(frozen=True)
class TaskAppObject:
    owner: Owner
    spec: TaskAppSpec
    status: dict[str, Any] = field(default_factory=dict)


def owner_of(obj: dict[str, Any]) -> Owner:
    meta = obj["metadata"]
    return Owner(
        kind=obj["kind"],
        name=meta["name"],
        namespace=meta.get("namespace") or "",
        uid=meta.get("uid") or "",
        generation=meta.get("generation") or 1,
        api_version=obj.get("apiVersion") or API_VERSION,
    )


def _spec(obj: dict[str, Any]) -> Any:
    cut = undecodable(obj)
    if cut is not None:  # an object nested deeper than the operator reads (controller/safejson.py)
        field = cut.removeprefix("spec.")
        raise SpecError(field, f"nested deeper than {MAX_DEPTH} levels; the operator does not read it",
                        "keep extras to a few levels of keys and values")  # fmt: skip
    try:
        return parse_spec(obj["kind"], obj.get("spec") or {})
    except ValidationError as err:
        raise spec_error(err) from err


def parse_job(obj: dict[str, Any]) -> Job:
    """An RLJob or SFTJob as the API server returns it -> Job; SpecError when its spec cannot be read or
    asks for what a cluster job may not do (a judge's key from anywhere but a Secret it names)."""
    spec = _spec(obj)
    if isinstance(spec, RLJobSpec) and spec.judge is not None:
        for name, message, fix in spec.judge.cluster_problems():
            field = "judge." + ".".join(to_camel(part) for part in name.split("."))
            raise SpecError(field, message, fix)
    return Job(owner=owner_of(obj), spec=spec, status=dict(obj.get("status") or {}))


def parse_task_app(obj: dict[str, Any]) -> TaskAppObject:
    return TaskAppObject(owner=owner_of(obj), spec=_spec(obj), status=dict(obj.get("status") or {}))
