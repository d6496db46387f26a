"""Cluster and ClusterTemplate specs, generated from the CRDs' own schemas, against the model
and the admission webhook (``services/admission``).

The generator reads ``openAPIV3Schema`` from ``deploy/crds`` (``from_schema``: objects with
their required and optional properties, strings with ``minLength`` and the ``ipv4`` format,
integers with ``minimum``, booleans, arrays, ``nullable``). CEL rules cannot be evaluated
here, so each rule the schema carries must have its Python reading in ``CEL``; a new rule
without one fails the test, rather than being silently skipped.

What must hold:

* a spec the API server would store (the schema and its CEL rules hold) validates against
  ``shared.models.ClusterSpec``, and the webhook admits it when its template and credentials
  exist: nothing the API server accepts is refused for its shape;
* a spec changed at one place (a value of another type, a required field removed, a number
  below its minimum, an empty string, a malformed address, a null where none is allowed, a
  field nobody knows) is either still fine or refused with a message naming that place
  (``spec.nodeGroups[0].count: ...``), so a user can tell what to fix;
* the reviews never raise, whatever the spec: arbitrary JSON, any name, any template version
  and any kubelet version in the old object's status.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from services.admission import logic
from services.admission.handlers import review_cluster, review_cluster_template
from shared.errors import KubeNotFound
from shared.kube import ResourceKind
from shared.models import ClusterSpec
from shared.webhook import AdmissionRequest, Verdict

Json = dict[str, Any]
Path_ = tuple[str | int, ...]

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
NS = "tenant"
TEMPLATE, SECRET = "k130", "creds"


def spec_schema(crd_file: str) -> Json:
    crd = yaml.safe_load((CRDS / crd_file).read_text())
    (version,) = crd["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


CLUSTER_SCHEMA = spec_schema("clusters.azimuth.stackhpc.com.yaml")
TEMPLATE_SCHEMA = spec_schema("clustertemplates.azimuth.stackhpc.com.yaml")


def _autoscaling(group: Json) -> bool:
    return group.get("autoscale") is True


#: every CEL rule of the schemas, read in Python (has() is false for absent and null alike)
CEL: dict[str, Callable[[Json], bool]] = {
    "(has(self.autoscale) && self.autoscale) || has(self.count)": (
        lambda g: _autoscaling(g) or g.get("count") is not None
    ),
    "!(has(self.autoscale) && self.autoscale) || has(self.minCount)": (
        lambda g: not _autoscaling(g) or g.get("minCount") is not None
    ),
    "!(has(self.autoscale) && self.autoscale) || has(self.maxCount)": (
        lambda g: not _autoscaling(g) or g.get("maxCount") is not None
    ),
    "!(has(self.autoscale) && self.autoscale) || !has(self.minCount) || !has(self.maxCount)"
    " || self.maxCount >= self.minCount": (
        lambda g: (
            not _autoscaling(g)
            or g.get("minCount") is None
            or g.get("maxCount") is None
            or g["maxCount"] >= g["minCount"]
        )
    ),
}

# --- the schema as a strategy ---------------------------------------------------------------

TEXT = st.text(max_size=8)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def from_schema(schema: Json) -> st.SearchStrategy[Any]:
    """Values the API server would accept for ``schema`` (the subset our CRDs use)."""
    values = _of_type(schema)
    for rule in schema.get("x-kubernetes-validations", []):
        holds = CEL[rule["rule"]]  # a KeyError here: a new CEL rule needs its reading in CEL
        values = values.filter(holds)
    return st.none() | values if schema.get("nullable") else values


def _of_type(schema: Json) -> st.SearchStrategy[Any]:
    kind = schema["type"]
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: from_schema(v) for k, v in properties.items() if k in required},
            optional={k: from_schema(v) for k, v in properties.items() if k not in required},
        )
    if kind == "array":
        return st.lists(from_schema(schema["items"]), max_size=3)
    if kind == "string" and schema.get("format") == "ipv4":
        return st.ip_addresses(v=4).map(str)
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=12)
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=2**63 - 1)
    assert kind == "boolean", f"a schema type the generator does not know: {kind}"
    return st.booleans()


VALID_SPECS = from_schema(CLUSTER_SCHEMA).map(
    # The spec names a template and credentials that exist, so the webhook can admit it.
    lambda spec: {**spec, "templateName": TEMPLATE, "cloudCredentialsSecretName": SECRET}
)

# --- one change at one place ----------------------------------------------------------------


def places(schema: Json, value: Any, at: Path_ = ()) -> Iterator[tuple[Path_, Json]]:
    """Every place in ``value`` with the schema that governs it."""
    yield at, schema
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in schema.get("properties", {}):
                yield from places(schema["properties"][key], inner, (*at, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from places(schema["items"], inner, (*at, i))


def other_type(schema: Json) -> st.SearchStrategy[Any]:
    """A JSON value of a type the schema does not allow."""
    allowed = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "boolean": bool,
    }[schema["type"]]
    return JSON.filter(lambda v: v is not None and type(v) is not allowed)


def below_range(schema: Json) -> st.SearchStrategy[Any] | None:
    """A value of the right type the schema's bounds or format refuse, if it has any."""
    if schema["type"] == "integer" and "minimum" in schema:
        return st.integers(max_value=schema["minimum"] - 1)
    if schema["type"] == "string" and schema.get("format") == "ipv4":
        return st.sampled_from(["300.1.1.1", "1.2.3", "::1", "a.b.c.d", ""])
    if schema["type"] == "string" and schema.get("minLength"):
        return st.just("")
    return None


@st.composite
def changed_once(draw: st.DrawFn) -> tuple[Json, Path_, str]:
    """A valid spec changed at one place: (spec, the place, how)."""
    spec = draw(VALID_SPECS)
    at, schema = draw(st.sampled_from(list(places(CLUSTER_SCHEMA, spec))))
    hows = ["retype"]
    if schema["type"] == "object":
        hows += ["unknown", "remove"] if schema.get("required") else ["unknown"]
    if below_range(schema) is not None:
        hows.append("range")
    if at and not schema.get("nullable"):
        hows.append("null")
    how = draw(st.sampled_from(hows))
    if how == "retype":
        return put(spec, at, draw(other_type(schema))), at, how
    if how == "null":
        return put(spec, at, None), at, how
    if how == "range":
        return put(spec, at, draw(below_range(schema))), at, how  # type: ignore[arg-type]
    target = get(spec, at)
    if how == "remove":
        field = draw(st.sampled_from(sorted(schema["required"])))
        return put(spec, at, {k: v for k, v in target.items() if k != field}), (*at, field), how
    unknown = draw(TEXT.filter(lambda k: k not in schema.get("properties", {})))
    return put(spec, at, {**target, unknown: draw(JSON)}), at, how


def get(value: Any, at: Path_) -> Any:
    for part in at:
        value = value[part]
    return value


def put(value: Any, at: Path_, new: Any) -> Any:
    """``value`` with ``new`` at ``at`` (copies along the path only)."""
    if not at:
        return new
    head, rest = at[0], at[1:]
    if isinstance(value, list):
        return [put(v, rest, new) if i == head else v for i, v in enumerate(value)]
    return {**value, head: put(value[head], rest, new)}


def named(at: Path_) -> str:
    """How the webhook names a place: ``spec.nodeGroups[0].count``."""
    return "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in at)


# --- the webhook's world --------------------------------------------------------------------


class Api:
    """One template per version string the tests use, and the credentials Secret."""

    def __init__(self, versions: dict[str, str] | None = None) -> None:
        self.versions = {TEMPLATE: "1.30.1", **(versions or {})}

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> Json:
        if name not in self.versions:
            raise KubeNotFound(name)
        values = {"kubernetesVersion": self.versions[name], "machineImageId": "img"}
        return {
            "metadata": {"name": name},
            "spec": {"label": name, "description": "d", "values": values},
        }

    async def exists(self, kind: ResourceKind, namespace: str | None, name: str) -> bool:
        return name == SECRET

    async def any_labelled(self, kind: ResourceKind, label_selector: str) -> bool:
        return False


def request(
    spec: Any, *, name: str = "c", operation: str = "CREATE", old: Json | None = None
) -> AdmissionRequest:
    obj = {"metadata": {"name": name, "namespace": NS}, "spec": spec}
    return AdmissionRequest(
        uid="u",
        operation=operation,
        kind="Cluster",
        name=name,
        namespace=NS,
        object=obj,
        old_object=old,
    )


LOOKUP_REFUSALS = (logic.SECRET_MISSING, logic.TEMPLATE_MISSING)

# --- properties -----------------------------------------------------------------------------


@given(VALID_SPECS)
async def test_a_spec_the_api_server_stores_is_one_the_model_reads_and_the_webhook_admits(
    spec: Json,
) -> None:
    assert logic.spec_problem(ClusterSpec, spec) is None
    assert await review_cluster(request(spec), api=Api()) == Verdict.allow()


@given(changed_once())
@example(
    changed=(
        {
            "label": "l",
            "templateName": TEMPLATE,
            "cloudCredentialsSecretName": SECRET,
            "controlPlaneMachineSize": "m",
            "nodeGroups": [{"name": "a", "machineSize": "m", "autoscale": True, "minCount": 2}],
        },
        ("nodeGroups", 0, "maxCount"),
        "remove",
    )
)
async def test_a_spec_changed_at_one_place_is_fine_or_refused_naming_that_place(
    changed: tuple[Json, Path_, str],
) -> None:
    spec, at, how = changed
    problem = logic.spec_problem(ClusterSpec, spec)
    verdict = await review_cluster(request(spec), api=Api())
    if problem is None:
        # Only a value of another type can still pass: the model converts what it safely can
        # ("3" for 3), which the API server's schema check refuses before the webhook.
        assert how in ("unknown", "retype")
        assert verdict.allowed or verdict.message.startswith(LOOKUP_REFUSALS)
        return
    assert (verdict.allowed, verdict.code, verdict.message) == (False, 400, problem)
    assert named(at) in problem
    # Every line of the refusal names a place in the spec.
    for line in problem.split("; "):
        assert re.match(r"spec(\.[A-Za-z][A-Za-z0-9]*|\[\d+\])*: ", line), line


@given(JSON | VALID_SPECS, st.text(max_size=70), st.sampled_from(["CREATE", "UPDATE"]))
async def test_the_cluster_review_never_raises(spec: Any, name: str, operation: str) -> None:
    old = (
        {"metadata": {"name": name}, "spec": {"templateName": "other"}}
        if operation == "UPDATE"
        else None
    )
    verdict = await review_cluster(
        request(spec, name=name, operation=operation, old=old), api=Api()
    )
    if not verdict.allowed:
        assert verdict.code == 400
        assert verdict.message.startswith(("spec", "metadata.name", *LOOKUP_REFUSALS))


VERSIONS = st.sampled_from(["1.29.9", "1.30.0", "v1.31.2", "2.0.0", "1.31.0-rc.1+b"]) | TEXT


@given(
    VALID_SPECS,
    VERSIONS,
    VERSIONS,
    st.dictionaries(TEXT, st.fixed_dictionaries({}, optional={"kubeletVersion": VERSIONS}) | JSON),
)
@example(
    spec={
        "label": "l",
        "templateName": TEMPLATE,
        "cloudCredentialsSecretName": SECRET,
        "controlPlaneMachineSize": "m",
    },
    current="v1.3\u0660.0",
    target="1.30.1",
    nodes={"n": {"kubeletVersion": "1.29.0"}},
)
async def test_a_template_change_is_decided_for_any_versions(
    spec: Json, current: str, target: str, nodes: Json
) -> None:
    api = Api({"current": current, TEMPLATE: target})
    old = {
        "metadata": {"name": "c"},
        "spec": {**spec, "templateName": "current"},
        "status": {"nodes": nodes},
    }
    verdict = await review_cluster(request(spec, operation="UPDATE", old=old), api=api)
    assert verdict.allowed or verdict.code == 400


@given(from_schema(TEMPLATE_SCHEMA) | JSON, st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
async def test_the_template_review_never_raises_and_names_the_field_it_refuses(
    spec: Any, operation: str
) -> None:
    obj = {"metadata": {"name": "t"}, "spec": spec}
    review = AdmissionRequest(
        uid="u", operation=operation, kind="ClusterTemplate", name="t", object=obj
    )
    verdict = await review_cluster_template(review, api=Api())
    if not verdict.allowed:
        assert verdict.message.startswith("spec")


@given(VERSIONS | st.text(alphabet="v0123456789.-+\u0660\u0663 ", max_size=12))
@example(text="v1.3\u0660.0")
def test_a_version_is_semver_in_ascii_digits_only(text: str) -> None:
    version = logic.parse_version(text)
    if version is not None:
        assert text.strip().isascii()
        assert logic.parse_version(str(version)) == version
