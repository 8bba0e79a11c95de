"""Reading back what the run loggers wrote: W&B's offline run file, an MLflow file store."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024  # the .wandb file is a LevelDB-style log: 32 KiB blocks, 7-byte record headers


def wandb_records(run_file: Path) -> list[Any]:
    """Every protobuf Record of an offline run's ``run-*.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", run_file
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def wandb_run(wandb_dir: Path) -> dict[str, Any]:
    """The one offline run under ``wandb_dir``: its history rows, final summary, config, name."""
    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    history, summary, config, name = [], {}, {}, None
    for rec in wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "run":
            name = rec.run.display_name
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
    tables = {p.name.split("_")[0] + "_" + p.name.split("_")[1]: json.loads(p.read_text())
              for p in run_file.parent.glob("files/media/table/*.table.json")}  # fmt: skip
    return {"history": history, "summary": summary, "config": config, "name": name, "tables": tables}


def mlflow_run(tracking_uri: str, experiment: str = "farm") -> dict[str, Any]:
    """The one run of ``experiment``: metric histories, status, artifacts (JSON ones parsed)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    rid = run.info.run_id
    history = {k: [(m.step, m.value) for m in client.get_metric_history(rid, k)] for k in run.data.metrics}
    artifacts = {a.path: json.loads(Path(client.download_artifacts(rid, a.path)).read_text())
                 for a in client.list_artifacts(rid)}  # fmt: skip
    return {"status": run.info.status, "name": run.info.run_name, "history": history, "artifacts": artifacts}
