#!/usr/bin/python3
"""Validates Kubernetes manifests offline against the API types of the official Python client
(Debian python3-kubernetes): every document must deserialise into its model (required fields
present, types right) and come back unchanged (no unknown or misspelt field). Prints the
documents as a JSON array, or the problems on stderr with exit status 1."""
import json, sys, yaml
from kubernetes import client

api = client.ApiClient()
out, errors = [], []

def diff(a, b, path):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k not in b:
                errors.append(f"{path}.{k}: unknown field")
            else:
                diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]")
    elif a != b:
        errors.append(f"{path}: {a!r} is read as {b!r}")

for f in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(f)):
        if doc is None:
            continue
        group, _, version = doc.get("apiVersion", "").rpartition("/")
        cls = version.capitalize() + doc.get("kind", "")
        where = f"{f}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if not hasattr(client.models, cls):
            errors.append(f"{where}: no model {cls}")
            continue
        try:
            obj = api._ApiClient__deserialize(doc, cls)
        except Exception as e:
            errors.append(f"{where}: {e}")
            continue
        diff(doc, api.sanitize_for_serialization(obj), where)
        out.append(doc)
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(json.dumps(out))
