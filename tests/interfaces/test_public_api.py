"""The `conductor` module is the whole Python surface: what `__all__` names is there, and the API
documents show a Python program importing nothing else of this repository."""

from __future__ import annotations

import re
from pathlib import Path

import conductor

DOCS = Path(__file__).resolve().parents[2] / "docs"
OUR_PACKAGES = ("worker", "workflows", "activities", "substrate")


def test_everything_in_all_is_exported_and_nothing_is_missing() -> None:
    assert sorted(conductor.__all__) == sorted(set(conductor.__all__))
    for name in conductor.__all__:
        assert hasattr(conductor, name), name
    public = {name for name in vars(conductor) if not name.startswith("_")}
    assert public == set(conductor.__all__), public ^ set(conductor.__all__)
    for name in ("MissionControl", "hold", "acquire", "kept", "HeldLease", "NotAdmitted", "HeldRequest"):
        assert name in conductor.__all__


def test_the_api_documents_show_only_the_conductor_module_to_python_programs() -> None:
    for doc in ("admission-api.md", "mission-control-api.md"):
        text = (DOCS / doc).read_text()
        blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
        assert blocks, doc
        for block in blocks:
            imports = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", block, flags=re.M)
            assert imports and all(name.split(".")[0] not in OUR_PACKAGES for name in imports), (doc, imports)
        assert not re.search(r"`(?:worker|workflows)\.(?:lease|mission_control)\.", text), doc
