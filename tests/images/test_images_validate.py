"""`farm validate-tasks` on rows as the datasets ship them, their images pulled from a real
registry (SWE-bench's, SWE-Gym's and R2E-Gym's layouts): the gold patch resolves and the empty
one does not, in each row's image; a row
whose image tag is missing is reported invalid with the registry's answer while the others
are validated (nothing lost)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.dataset_images import SWEGYM_TEMPLATE, publish_r2e_image

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def validate(tmp_path: Path, rows: list[dict], *sets: str, name: str) -> dict:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = tmp_path / f"{name}.report.json"
    res = subprocess.run(
        [sys.executable, "-m", "farm", "validate-tasks", str(path), "--report", str(report),
         "--set", f"envs.cache_dir={tmp_path / 'envs'}", "--set", f"sandbox.local.base_dir={tmp_path / 'sb'}",
         "--set", f"tasks.cache_dir={tmp_path / 'tc'}", *[x for s in sets for x in ("--set", s)]],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900,
    )  # fmt: skip
    assert report.is_file(), res.stdout + res.stderr
    return {r["task_id"]: r for r in json.loads(report.read_text())["results"]}


def test_validate_rows_in_their_images(tmp_path: Path, dataset_images):
    host, rows = dataset_images
    swebench = {**rows["swebench"], "log_parser": "parse_log_pytest"}  # SWE-bench's parser, by its name
    missing = {**rows["swebench"], "instance_id": "acme__gone-1", "image_name": f"{host}/swebench/gone:latest"}
    # R2E-Gym's layout (the layout held out while farm's image support was built): its own venv in the
    # repository, its held-out tests at /r2e_tests, graded against expected_output_json
    r2e = publish_r2e_image(host, tmp_path / "r2e-layout", tmp_path / "demo")
    results = validate(tmp_path, [swebench, missing, r2e], name="auto")
    (r2e_id,) = [k for k in results if k.startswith("r2e-")]
    assert results[r2e_id]["valid"], results[r2e_id]
    assert results[r2e_id]["empty"]["status"] == "unresolved" and "differ from the expected statuses" in \
        results[r2e_id]["empty"]["reason"]  # fmt: skip
    assert results["demo-slugs"]["valid"], results["demo-slugs"]
    assert results["demo-slugs"]["gold"]["status"] == "resolved" and results["demo-slugs"]["empty"]["status"] == "unresolved"
    assert not results["acme__gone-1"]["valid"]
    assert "swebench/gone:latest: not found on registry" in results["acme__gone-1"]["reason"]
    # SWE-Gym's rows name no image: its dataset's convention does, under the configured registry
    gym = validate(tmp_path, [rows["swegym"]], "tasks.format=swegym", f"tasks.images.registry={host}",
                   f"tasks.images.datasets.swegym.name={SWEGYM_TEMPLATE}", name="swegym")  # fmt: skip
    assert gym["demo-wordfreq"]["valid"], gym["demo-wordfreq"]
    # the shared layers were unpacked once into the store both runs used
    metas = [json.loads(p.read_text()) for p in (tmp_path / "envs").glob("*/meta.json")]
    layers = [m for m in metas if m["kind"] == "layer"]  # Debian, conda's layout, and one per instance
    assert len(layers) == 5 and sorted(m["kind"] for m in metas if m["kind"] == "image") == ["image"] * 3
