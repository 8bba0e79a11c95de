"""The Samples column table's claims hold: every column of SAMPLE_SCHEMA is described (a
new one without a description is refused), and a PyTorch row holds what the table says
it does instead of the column (tensor dtypes, metadata as a dict, routed_experts only
when set). The committed page equal to the generated table: tests/docs/test_docs_reference.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from farm.trajectory import columns
from farm.trajectory.schema import SAMPLE_SCHEMA, Sample

torch = pytest.importorskip("torch")


def _sample(**kw) -> Sample:
    return Sample(rollout_id="t.0", tokens=[5, 6, 7, 8], prompt_length=2, response_length=2, loss_mask=[1, 0],
                  rollout_logprobs=[-0.5, 0.0], metadata={"attempt": 1, "grading": {"flags": []}}, **kw)  # fmt: skip


def test_a_torch_row_holds_what_the_table_says():
    from farm.output.torch_data import sample_tensors

    dtypes = {"int64 tensor": torch.int64, "uint8 tensor": torch.uint8, "float32 tensor": torch.float32}
    experts = np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2)  # [len(tokens) - 1, layers, top_k]
    row = sample_tensors(_sample(routed_experts=experts))
    assert set(row) == set(SAMPLE_SCHEMA.names)
    for name, what in columns.TORCH.items():
        kind = what.split(" `")[0].split(";")[0]
        if kind in dtypes:
            assert torch.is_tensor(row[name]) and row[name].dtype == dtypes[kind], name
        else:
            assert what.startswith("a dict") and row[name] == {"attempt": 1, "grading": {"flags": []}}, name
    assert tuple(row["routed_experts"].shape) == (3, 2, 2)
    for name in set(SAMPLE_SCHEMA.names) - set(columns.TORCH):  # the rest: plain values
        assert not torch.is_tensor(row[name]) and not isinstance(row[name], (dict, np.ndarray)), name
    assert "routed_experts" not in sample_tensors(_sample())  # null: the key is absent


def test_a_column_without_a_description_is_refused(monkeypatch):
    assert "| `loss_mask` | list\\<uint8\\> | uint8 tensor |" in columns.columns_markdown()
    monkeypatch.setattr(columns, "SAMPLE_SCHEMA", SAMPLE_SCHEMA.append(pa.field("new_column", pa.int32())))
    with pytest.raises(ValueError, match=r"describe \['new_column'\]"):
        columns.columns_markdown()


def test_the_page_is_written_between_its_markers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(f"# x\n\n{columns.START}\nold table\n{columns.END}\n\nafter\n")
    assert columns.main([str(page)]) == 0
    text = page.read_text()
    assert "old table" not in text and text.endswith(f"{columns.END}\n\nafter\n") and "`routed_experts`" in text
    page.write_text("# no markers\n")
    with pytest.raises(ValueError, match="markers"):
        columns.main([str(page)])
