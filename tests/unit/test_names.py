"""shared.names: the longest Cluster name follows from the table, and refusals say why."""

import pytest

from shared import names


def test_the_helm_release_binds_first() -> None:
    assert names.MAX_LENGTH == 53
    assert names.STRICTEST.names == "the Helm release name"
    assert min(row.allowed for row in names.DERIVED) == names.MAX_LENGTH


def test_a_prefix_or_suffix_counts_against_the_limit() -> None:
    rows = {row.form: row for row in names.DERIVED}
    assert rows["kube-{name}"].allowed == 253 - len("kube-")
    assert rows["{name}-kubeconfig-user"].allowed == 253 - len("-kubeconfig-user")
    assert rows["{name}"].render("demo") == "demo"
    assert rows["{name}-etcd-key"].render("demo") == "demo-etcd-key"


def test_every_derived_name_in_the_services_is_listed() -> None:
    forms = {row.form for row in names.DERIVED}
    for form in (
        "kube-{name}",
        "{name}-kubeconfig",
        "{name}-kubeconfig-user",
        "{name}-zenith-apiserver",
        "{name}-etcd-key",
        "{name}-zenith-credential",
    ):
        assert form in forms


@pytest.mark.parametrize("name", ["demo", "a", "a" * 53, "my.cluster", "x-1"])
def test_names_every_derived_name_can_carry(name: str) -> None:
    assert names.problem(name) is None
    assert names.release_name_problem(name) is None


def test_too_long_names_the_limit_and_the_actual_length() -> None:
    assert names.problem("a" * 60) == (
        "name is 60 characters; at most 53 are allowed because it is the Helm release name"
    )
    assert names.problem("a" * 54) is not None


@pytest.mark.parametrize("name", ["Demo", "under_score", "-dash", "dash-", ""])
def test_names_helm_refuses_by_shape(name: str) -> None:
    problem = names.problem(name)
    assert problem is not None
    assert "Helm release name" in problem
    assert names.release_name_problem(name) is not None


def test_release_name_problem_names_helms_limit() -> None:
    assert names.release_name_problem("a" * 60) == (
        "release name is 60 characters; helm allows at most 53"
    )


def test_the_refusal_can_be_built_around_an_expression() -> None:
    assert names.length_problem("' + n + '") == (
        "name is ' + n + ' characters; at most 53 are allowed because it is the Helm release name"
    )
