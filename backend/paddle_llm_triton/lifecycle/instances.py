"""Which Triton model instance this process is, among the instances of its model.

Triton names the instances of an `instance_group` "<group name>_<index>", and a group without a
name is called "<model>_<group position>": `instance_group [ { count: 2 kind: KIND_CPU } ]` on
model `llm` gives "llm_0_0" and "llm_0_1", each in its own stub process. Triton gives every
KIND_CPU instance device id 0, so the instance's position among all instances (its ordinal) is what
selects a device, and the names are how sibling instances find each other (control_bus).
"""

from __future__ import annotations

import re


def instance_names(model_config: dict, model_name: str) -> list[str]:
    """Every instance name of the model, in order (group by group, index by index)."""
    groups = model_config.get("instance_group") or [{"count": 1}]
    names = []
    for g, grp in enumerate(groups):
        gname = grp.get("name") or f"{model_name}_{g}"
        names += [f"{gname}_{i}" for i in range(int(grp.get("count", 1) or 1))]
    return names


def instance_ordinal(model_config: dict, model_name: str, instance_name: str) -> int:
    """0-based position of `instance_name` among all instances of the model ("llm_0_1" -> 1).

    A name the config does not list (unexpected naming) falls back to its trailing index."""
    names = instance_names(model_config, model_name)
    if instance_name in names:
        return names.index(instance_name)
    m = re.search(r"_(\d+)$", instance_name or "")
    return int(m.group(1)) if m else 0
