"""Vendor one version of a CustomResourceDefinition's OpenAPI schema as a small JSON file, for the
offline validation of deploy/kubernetes/ (tests/deploy/test_kubernetes_manifests.py).

    .venv/bin/python tests/deploy/vendor_crd_schema.py CRD.yaml VERSION RELEASE SOURCE_URL OUT.json

CRD.yaml: the CRD as its project publishes it (a local copy of SOURCE_URL at the tag RELEASE);
VERSION: the served API version to take (v1). The `description` fields are dropped (they make up
most of the bytes and validate nothing); every other keyword, x-kubernetes-* included, is kept as
published, so the test sees the CRD's own rules. The file records where it came from.
"""

from __future__ import annotations

import json
import sys

import yaml


def strip_descriptions(node):
    """The schema without its `description` keys (recursively). A property that is itself named
    `description` is kept: it sits under `properties`, where the key is a field name."""
    if isinstance(node, dict):
        return {k: (strip_descriptions_in_properties(v) if k == "properties" else strip_descriptions(v))
                for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def strip_descriptions_in_properties(props: dict) -> dict:
    """A `properties` map: its keys are field names (one may be `description`), its values schemas."""
    return {name: strip_descriptions(schema) for name, schema in props.items()}


def vendor(crd_text: str, version: str, release: str, source_url: str) -> dict:
    """The JSON document written for one CRD version: provenance plus the stripped schema."""
    crd = yaml.safe_load(crd_text)
    spec = crd["spec"]
    match = [v for v in spec["versions"] if v["name"] == version]
    if not match:
        raise SystemExit(f"{crd['metadata']['name']} has no version {version}")
    return {
        "source": source_url,
        "release": release,
        "crd": crd["metadata"]["name"],
        "apiVersion": f"{spec['group']}/{version}",
        "kind": spec["names"]["kind"],
        "note": "openAPIV3Schema of this CRD version, description fields removed; "
                "regenerate with tests/deploy/vendor_crd_schema.py",
        "openAPIV3Schema": strip_descriptions(match[0]["schema"]["openAPIV3Schema"]),
    }


def main(argv: list[str]) -> int:
    """Command line: see the module doc."""
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    crd_path, version, release, source_url, out = argv
    with open(crd_path, encoding="utf-8") as f:
        doc = vendor(f.read(), version, release, source_url)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
