"""Validates Kubernetes manifests strictly, offline, for tests/tests/manifests.rs.

    python3 validate.py FILE...

Every YAML document of every FILE is checked against the schema of its
apiVersion and kind, with unknown fields rejected, types checked and required
fields required (what `kubectl apply --validate=strict` asks of the API
server):

- Kubernetes' own kinds (apps/v1 DaemonSet, v1 Service, ...): the `-strict`
  JSON schemas that kubernetes-validate bundles (every object closed with
  additionalProperties: false), for each version in KUBERNETES.
- monitoring.coreos.com/v1 (ServiceMonitor, PrometheusRule, ...): the Prometheus
  Operator's CRDs as the Pydantic models cloudcoil-models-prometheus-operator
  generates from their openAPIV3Schema (types, enums, patterns, required
  fields), made strict: the models ignore unknown fields and accept Python
  attribute names (`target_label`) for the CRD's (`targetLabel`) unless
  their base class says otherwise, so it is told before they are defined.

A document of any other kind fails: nothing passes unchecked. Prints one
line per document and file, `ok PATH: KIND/NAME (SCHEMA)` or
`FAIL PATH: KIND/NAME (SCHEMA): WHERE: WHY`, and exits 1 if any failed.

The packages come from PYTHONPATH: `cargo xtask test` installs them
(xtask/src/setup.rs, SCHEMA_PACKAGES) and sets STALL_SCHEMAS_PATH.
"""

import json
import sys

import cloudcoil.pydantic

# Before any model class exists: each copies its base's configuration.
cloudcoil.pydantic.BaseModel.model_config.update(extra="forbid", populate_by_name=False)

import kubernetes_validate  # noqa: E402
import pydantic  # noqa: E402
import yaml  # noqa: E402
from cloudcoil.models.prometheus_operator import v1 as monitoring_v1  # noqa: E402

# 1.28 (nothing in deploy/ needs a newer one) and the newest the package
# knows.
_newest = kubernetes_validate.utils.latest_version()
KUBERNETES = ["1.28", kubernetes_validate.utils.major_minor(_newest)]
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"


def operator_model(kind):
    model = getattr(monitoring_v1, kind, None)
    if not isinstance(model, type) or not issubclass(model, pydantic.BaseModel) or "api_version" not in model.model_fields:
        return None
    if model.model_fields["api_version"].default != PROMETHEUS_OPERATOR:
        return None
    assert model.model_config.get("extra") == "forbid", f"{kind} was defined before it could be made strict"
    return model


def check(doc):
    """Yields (schema, error or None) for one document."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if api_version == PROMETHEUS_OPERATOR:
        model = operator_model(kind)
        if model is None:
            yield (f"{api_version} {kind}", "no such kind in the Prometheus Operator's CRDs")
            return
        schema = f"prometheus-operator CRD {kind}"
        try:
            # JSON in, strict: "9464" is no integer, as for the API server.
            model.model_validate_json(json.dumps(doc), strict=True)
            yield (schema, None)
        except pydantic.ValidationError as e:
            yield (schema, "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()))
        return
    for version in KUBERNETES:
        try:
            used = kubernetes_validate.validate(doc, version, strict=True)
            yield (f"Kubernetes {used} strict", None)
        except kubernetes_validate.ValidationError as e:
            yield (f"Kubernetes {e.version} strict", f"{'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            yield (f"Kubernetes {version} strict", e.message)


def main(paths):
    failed = False
    for path in paths:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        if not docs:
            print(f"FAIL {path}: no YAML document")
            failed = True
        for doc in docs:
            if not isinstance(doc, dict):
                print(f"FAIL {path}: a document that is not a mapping")
                failed = True
                continue
            name = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            for schema, error in check(doc):
                if error is None:
                    print(f"ok {path}: {name} ({schema})")
                else:
                    print(f"FAIL {path}: {name} ({schema}): {error}")
                    failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
