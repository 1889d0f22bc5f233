#!/usr/bin/env python3
"""Validates custom resources against the openAPIV3Schema of the generated CRDs.

kubernetes-validate knows only the built-in kinds (it warns and passes on a custom
resource), so the example GridNetwork, GridSite and InferenceProvider are checked here
against docs/crds/*.yaml, strictly: an unknown field fails, as the API server would prune
it silently. Usage: validate-custom-resources.py CRD_DIR FILE...
Runs in .venv (made by .ci/install), which has PyYAML and jsonschema.
"""
import glob
import os
import sys

import jsonschema
import yaml


def strict(schema):
    """Adds additionalProperties: false wherever the schema lists properties and does not
    preserve unknown fields; drops the OpenAPI-only keywords."""
    if isinstance(schema, dict):
        schema.pop("nullable", None)
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


def crd_schemas(crd_dir):
    schemas = {}
    for path in sorted(glob.glob(os.path.join(crd_dir, "*.yaml"))):
        with open(path) as f:
            crd = yaml.safe_load(f)
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            # metadata is the API server's, checked by it, not by the CRD schema.
            schema.setdefault("properties", {})["apiVersion"] = {"type": "string"}
            schema["properties"]["kind"] = {"type": "string"}
            schema["properties"]["metadata"] = {"type": "object"}
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    schemas = crd_schemas(sys.argv[1])
    failed = 0
    checked = 0
    for path in sys.argv[2:]:
        with open(path) as f:
            documents = [d for d in yaml.safe_load_all(f) if d]
        for doc in documents:
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key not in schemas:
                continue
            checked += 1
            name = f"{doc['kind']}/{doc.get('metadata', {}).get('name')}"
            try:
                jsonschema.validate(doc, schemas[key])
                print(f"INFO {path} passed for {name}")
            except jsonschema.ValidationError as e:
                where = ".".join(str(p) for p in e.absolute_path)
                print(f"ERROR {path} {name}: {where}: {e.message}")
                failed += 1
    if checked == 0:
        print("ERROR no custom resource of the CRDs found")
        failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
