#!/usr/bin/env python3
"""Writes the subset of an OpenAPI description that the recovery tests check the fakes against:
the paths whose name contains one of the given parts, and every component they refer to
(transitively), with the description's `info`. Usage:

    python3 scripts/openapi-subset.py SPEC.json OUT.json PART [PART...]

For tests/fixtures/github/openapi-hook-deliveries.json: SPEC is
`node_modules/@octokit/openapi/generated/api.github.com.json` (npm `@octokit/openapi`, which
publishes github/rest-api-description's description), PART `/deliveries`.
"""
import json
import sys

sys.dont_write_bytecode = True


def refs(node, found):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            found.add(ref)
        for value in node.values():
            refs(value, found)
    elif isinstance(node, list):
        for value in node:
            refs(value, found)


def main():
    spec_path, out_path, *parts = sys.argv[1:]
    if not parts:
        sys.exit(__doc__)
    spec = json.load(open(spec_path))
    paths = {p: v for p, v in spec["paths"].items() if any(part in p for part in parts)}
    components, seen, todo = {}, set(), set()
    refs(paths, todo)
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, _, kind, name = ref.split("/", 3)
        node = spec["components"][kind][name]
        components.setdefault(kind, {})[name] = node
        refs(node, todo)
    subset = {
        "openapi": spec["openapi"],
        "info": spec["info"],
        "paths": dict(sorted(paths.items())),
        "components": {k: dict(sorted(v.items())) for k, v in sorted(components.items())},
    }
    with open(out_path, "w") as out:
        json.dump(subset, out, indent=1, sort_keys=False)
        out.write("\n")


main()
