"""Config repair checked by a validator script: a service's JSON config has defects; `schema.json`
describes every setting and `validate.py` (in the work dir) reports what is wrong.

Repair rules stated in the instruction: a value of the wrong type that converts cleanly is converted;
a missing required setting, an invalid enum value or an out-of-range number takes the schema default;
every valid setting stays as it is. Knobs by level: number of settings and nesting depth, number of
defects (1 / 2 / 4), distractors (valid edge values, unknown-but-harmless comments that must stay).
"""

from __future__ import annotations

import copy
import json
import random

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

VALIDATOR = r'''"""Validate a config against schema.json. Usage: python3 validate.py CONFIG [SCHEMA]"""
import json, sys

def get(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node

def check(cfg, schema):
    errors = []
    for path, spec in sorted(schema["fields"].items()):
        found, value = get(cfg, path)
        if not found:
            if spec.get("required"):
                errors.append(f"{path}: missing")
            continue
        t = spec["type"]
        ok = {"int": isinstance(value, int) and not isinstance(value, bool), "bool": isinstance(value, bool),
              "str": isinstance(value, str),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool)}[t]
        if not ok:
            errors.append(f"{path}: expected {t}, got {type(value).__name__}")
            continue
        if "enum" in spec and value not in spec["enum"]:
            errors.append(f"{path}: {value!r} not one of {spec['enum']}")
        if "min" in spec and value < spec["min"] or "max" in spec and value > spec["max"]:
            errors.append(f"{path}: {value} out of range [{spec.get('min')}, {spec.get('max')}]")
    return errors

if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    schema = json.load(open(sys.argv[2] if len(sys.argv) > 2 else "schema.json"))
    errors = check(cfg, schema)
    for e in errors:
        print(e)
    print("OK" if not errors else f"{len(errors)} problem(s)")
    sys.exit(1 if errors else 0)
'''

SOLUTION = r"""python3 - <<'PY'
import json
cfg = json.load(open('service.json'))
schema = json.load(open('schema.json'))

def convert(value, t):
    if t == 'int' and isinstance(value, str) and value.strip().lstrip('-').isdigit():
        return int(value.strip())
    if t == 'float' and isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    if t == 'bool' and isinstance(value, str) and value.strip().lower() in ('true', 'false'):
        return value.strip().lower() == 'true'
    if t == 'str' and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None

def valid(value, spec):
    t = spec['type']
    ok = {'int': isinstance(value, int) and not isinstance(value, bool), 'bool': isinstance(value, bool),
          'str': isinstance(value, str), 'float': isinstance(value, (int, float)) and not isinstance(value, bool)}[t]
    if not ok:
        return False
    if 'enum' in spec and value not in spec['enum']:
        return False
    return not ('min' in spec and value < spec['min'] or 'max' in spec and value > spec['max'])

for path, spec in schema['fields'].items():
    *parents, leaf = path.split('.')
    node = cfg
    for p in parents:
        node = node.setdefault(p, {})
    if leaf not in node:
        if spec.get('required'):
            node[leaf] = spec['default']
        continue
    value = node[leaf]
    if valid(value, spec):
        continue
    converted = convert(value, spec['type'])
    node[leaf] = converted if converted is not None and valid(converted, spec) else spec['default']
json.dump(cfg, open('service.json', 'w'), indent=2)
PY"""

TESTS = """
import subprocess

def _cfg():
    return json.loads((W / "service.json").read_text())

def _get(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node

def test_config_is_valid_json_object():
    assert isinstance(_cfg(), dict)

def test_validator_passes():
    (pathlib.Path("/verifier") / "validate.py").write_text(EXPECTED["validator"])
    (pathlib.Path("/verifier") / "schema.json").write_text(json.dumps(EXPECTED["schema"]))
    r = subprocess.run(["/usr/bin/python3", "-I", "/verifier/validate.py", str(W / "service.json"),
                        "/verifier/schema.json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout[-500:]

def test_defects_repaired_as_specified():
    cfg = _cfg()
    wrong = {p: _get(cfg, p) for p, v in EXPECTED["repaired"].items() if _get(cfg, p) != v}
    assert not wrong, wrong

def test_valid_settings_unchanged():
    cfg = _cfg()
    changed = [p for p, v in EXPECTED["unchanged"].items() if _get(cfg, p) != v]
    assert not changed, changed
"""

SECTIONS = ["server", "database", "cache", "logging", "auth", "queue"]
FIELDS = [  # (name, type, default, extra constraints, value generator)
    ("port", "int", 8080, {"min": 1, "max": 65535}, lambda r: r.choice([80, 443, 8000, 8443, 9090, 65535])),
    ("host", "str", "0.0.0.0", {}, lambda r: r.choice(["127.0.0.1", "0.0.0.0", "db.internal", "cache.local"])),
    ("workers", "int", 4, {"min": 1, "max": 64}, lambda r: r.randint(1, 64)),
    ("timeout_s", "float", 30.0, {"min": 0.5, "max": 600}, lambda r: r.choice([0.5, 2.5, 30.0, 120.0])),
    ("enabled", "bool", True, {}, lambda r: r.choice([True, False])),
    ("log_level", "str", "info", {"enum": ["debug", "info", "warn", "error"]}, lambda r: r.choice(["debug", "warn", "error"])),
    ("retries", "int", 3, {"min": 0, "max": 10}, lambda r: r.randint(0, 10)),
    ("mode", "str", "primary", {"enum": ["primary", "replica", "standby"]}, lambda r: r.choice(["replica", "standby"])),
]
DEFECTS = ["string_number", "missing", "bad_enum", "out_of_range", "string_bool"]


class ConfigRepair(Family):
    name = "config_repair"
    description = "repair a service's JSON config so its validator passes, changing only what is wrong"

    def draft(self, level: int, rng: random.Random) -> Draft:
        n_sections, per_section, n_defects = {1: (1, 4, 1), 2: (3, 4, 2), 3: (5, 5, 4)}[level]
        schema: dict[str, dict] = {}
        cfg: dict = {}
        for section in rng.sample(SECTIONS, n_sections):
            node = cfg.setdefault(section, {})
            for name, t, default, extra, gen in rng.sample(FIELDS, per_section):
                path = f"{section}.{name}"
                if level == 3 and rng.random() < 0.3:  # deeper nesting
                    node.setdefault("advanced", {})[name] = gen(rng)
                    path = f"{section}.advanced.{name}"
                else:
                    node[name] = gen(rng)
                schema[path] = {"type": t, "required": True, "default": default, **extra}
        good = copy.deepcopy(cfg)
        broken = copy.deepcopy(cfg)
        repaired: dict[str, object] = {}
        candidates = sorted(schema)
        rng.shuffle(candidates)
        for path in candidates:
            if len(repaired) == n_defects:
                break
            spec = schema[path]
            defect = rng.choice([k for k in DEFECTS if self._applies(k, spec)])
            *parents, leaf = path.split(".")
            node = broken
            for p in parents:
                node = node[p]
            value = node[leaf]
            if defect == "string_number":
                node[leaf], repaired[path] = str(value), value
            elif defect == "string_bool":
                node[leaf], repaired[path] = str(value).lower(), value
            elif defect == "missing":
                del node[leaf]
                repaired[path] = spec["default"]
            elif defect == "bad_enum":
                node[leaf], repaired[path] = rng.choice(["verbose", "trace", "master", "auto"]), spec["default"]
            else:  # out_of_range
                node[leaf], repaired[path] = spec["max"] + rng.randint(1, 1000), spec["default"]
        unchanged = {p: self._get(good, p) for p in schema if p not in repaired}
        if level >= 2:  # a harmless extra key the validator ignores: must survive
            section = rng.choice(sorted(broken))
            broken[section]["_comment"] = unchanged[f"{section}._comment"] = "managed by ops; do not remove"
        files = [FileSpec(path="service.json", content=json.dumps(broken, indent=2) + "\n"),
                 FileSpec(path="schema.json", content=json.dumps({"fields": schema}, indent=2, sort_keys=True) + "\n"),
                 FileSpec(path="validate.py", content=VALIDATOR)]
        instruction = (
            "The service refuses to start because `service.json` is invalid: `python3 validate.py service.json` "
            "lists the problems, and `schema.json` describes every setting. Repair `service.json` in place so "
            "the validator passes. A value of the wrong type that converts cleanly (e.g. \"8080\" for an int, "
            "\"true\" for a bool) must be converted; a missing required setting, a value outside its allowed "
            "set, or a number out of range takes the schema's default. Leave every valid setting, and any "
            "other keys, exactly as they are."
        )
        expected = {"repaired": repaired, "unchanged": unchanged, "validator": VALIDATOR,
                    "schema": {"fields": schema}}
        return Draft(instruction, files, tests_module(expected, TESTS), [SOLUTION],
                     {"settings": len(schema), "defects": n_defects, "sections": n_sections},
                     protected=["schema.json", "validate.py"])

    @staticmethod
    def _applies(defect: str, spec: dict) -> bool:
        t = spec["type"]
        return {"string_number": t in ("int", "float"), "string_bool": t == "bool", "missing": True,
                "bad_enum": "enum" in spec, "out_of_range": "max" in spec}[defect]

    @staticmethod
    def _get(cfg: dict, dotted: str):
        node = cfg
        for part in dotted.split("."):
            node = node[part]
        return node
