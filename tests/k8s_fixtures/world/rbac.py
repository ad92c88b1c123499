"""RBAC as the API server authorizes a ServiceAccount's requests (kubernetes/kubernetes
``plugin/pkg/auth/authorizer/rbac/rbac.go``: ``RBACAuthorizer.Authorize`` visits the rules of
every ClusterRole bound to the user by a ClusterRoleBinding (any request) and every Role or
ClusterRole bound by a RoleBinding in the request's namespace, ``RuleAllows``: verb, API group,
resource and, for a request that names its object, ``resourceNames``; a ``create``, ``list``
or ``watch`` names none, so a rule with ``resourceNames`` never allows one).

A request carrying ``Authorization: Bearer system:serviceaccount:<namespace>:<name>`` (the
world's token of that ServiceAccount, standing for the projected token a pod mounts) is that
ServiceAccount; one without a token is the cluster's admin (the kubeconfig the controller and
the CLI are tested with), allowed everything. Denials read as the API server's
(``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go``, ``forbiddenMessage``)."""

from __future__ import annotations

from typing import Any

from k8s_fixtures.world.store import ApiError, Resource, Store, _res

SERVICE_ACCOUNTS = _res("", "v1", "serviceaccounts", "ServiceAccount")
ROLES = _res("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = _res("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTER_ROLES = _res("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = _res("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False)
RBAC_RESOURCES = (SERVICE_ACCOUNTS, ROLES, ROLE_BINDINGS)  # a workload's workers' access (owned by its JobSet)
CLUSTER_RBAC_RESOURCES = (CLUSTER_ROLES, CLUSTER_ROLE_BINDINGS)
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


def token_of(namespace: str, name: str) -> str:
    """The bearer token the world accepts for a ServiceAccount."""
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def verb_of(method: str, name: str | None, watching: bool) -> str:
    if method == "GET":
        return "get" if name else ("watch" if watching else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete" if name else "deletecollection"}[method]


def _rule_allows(rule: dict[str, Any], verb: str, resource: Resource, name: str | None) -> bool:
    def has(values: list[str] | None, wanted: str) -> bool:
        return bool(values) and ("*" in values or wanted in values)

    if not (has(rule.get("verbs"), verb) and has(rule.get("apiGroups"), resource.group) and has(rule.get("resources"), resource.plural)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


def authorize(store: Store, authorization: str | None, method: str, resource: Resource, namespace: str | None,
              name: str | None, watching: bool) -> None:
    """Raise the API server's 403 when a ServiceAccount's request is not allowed."""
    token = (authorization or "").removeprefix("Bearer ").strip()
    if not token.startswith(SERVICE_ACCOUNT_PREFIX):
        return  # the admin
    sa_namespace, _, sa_name = token.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    verb = verb_of(method, name, watching)

    def allowed_by(binding: dict[str, Any], binding_namespace: str | None) -> bool:
        subjects = binding.get("subjects") or []
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa_name and s.get("namespace", binding_namespace) == sa_namespace
                   for s in subjects):
            return False
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            role = store.get(CLUSTER_ROLES, "", ref.get("name", ""))
        elif ref.get("kind") == "Role" and binding_namespace:
            role = store.get(ROLES, binding_namespace, ref.get("name", ""))
        else:
            role = None
        return role is not None and any(_rule_allows(rule, verb, resource, name) for rule in role.get("rules") or [])

    if any(allowed_by(b, None) for b in store.items(CLUSTER_ROLE_BINDINGS)):
        return
    if namespace and any(allowed_by(b, namespace) for b in store.items(ROLE_BINDINGS, namespace)):
        return
    group = f".{resource.group}" if resource.group else ""
    what = f'{resource.plural}{group} "{name}"' if name else f"{resource.plural}{group}"
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    raise ApiError(403, "Forbidden", f'{what} is forbidden: User "{token}" cannot {verb} resource "{resource.plural}" in API group '
                                     f'"{resource.group}"{where}', name, resource.plural)
