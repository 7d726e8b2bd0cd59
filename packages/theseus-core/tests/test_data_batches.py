"""Prepared datasets on disk and the batch plan read from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from theseus.data.batches import IGNORE, MixturePlan
from theseus.data.prepared import DataNotPreparedError, PreparedData, write_prepared
from theseus.data.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def _prepare(root: Path, name: str, docs: list[str], val_docs: list[str]) -> PreparedData:
    write_prepared(
        root / "data" / name,
        {"train": TOK.encode_batch(docs), "val": TOK.encode_batch(val_docs)},
        tokenizer=TOK,
        meta={"source": "test"},
    )
    return PreparedData.open(root, name)


def test_round_trip_of_tokens_and_document_offsets(tmp_path: Path) -> None:
    data = _prepare(tmp_path, "toy", ["hello", "", "world!"], ["v"])
    np.testing.assert_array_equal(data.tokens("train"), TOK.encode_batch(["hello", "", "world!"]))
    assert data.doc_starts("train").tolist() == [0, 6, 7]
    assert data.header["count"] == {"train": 14, "val": 2}
    assert data.tokenizer == TOK


def test_unprepared_dataset_error_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(DataNotPreparedError) as info:
        PreparedData.open(tmp_path, "synthetic")
    assert f"theseus data prepare synthetic --root {tmp_path}" in str(info.value)


def test_folder_without_header_reads_as_unprepared(tmp_path: Path) -> None:
    data = _prepare(tmp_path, "toy", ["abc"], ["d"])
    (data.directory / "header.json").unlink()  # what a crash before the header leaves
    with pytest.raises(DataNotPreparedError):
        PreparedData.open(tmp_path, "toy")


def _stream(tmp_path: Path, n_docs: int = 200) -> PreparedData:
    rng = np.random.default_rng(0)
    docs = [
        "".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(5, 90)))
        for _ in range(n_docs)
    ]
    return _prepare(tmp_path, "letters", docs, docs[:20])


def test_pmd_rows_are_windows_of_the_stream_with_shifted_targets(tmp_path: Path) -> None:
    data = _stream(tmp_path)
    plan = MixturePlan([data], [1.0], ["pmd"], seed=3)
    batch = plan.batch(step=5, split="train", rows=8, block_size=32)
    assert batch["x"].shape == batch["y"].shape == (8, 32)
    np.testing.assert_array_equal(batch["x"][:, 1:], batch["y"][:, :-1])
    assert batch["padding_mask"].all()
    stream = np.asarray(data.tokens("train"), dtype=np.int32)
    for row in batch["x"]:
        # every row is somewhere in the stream, byte for byte
        hits = np.flatnonzero(
            np.all(np.lib.stride_tricks.sliding_window_view(stream, 32) == row, axis=1)
        )
        assert hits.size >= 1


def test_plan_is_pure_in_seed_step_and_split(tmp_path: Path) -> None:
    data = _stream(tmp_path)
    plan = MixturePlan([data], [1.0], ["pmd"], seed=3)
    a = plan.batch(7, "train", 8, 16)
    b = MixturePlan([PreparedData.open(tmp_path, "letters")], [1.0], ["pmd"], seed=3).batch(
        7, "train", 8, 16
    )
    np.testing.assert_array_equal(a["x"], b["x"])
    assert (plan.batch(8, "train", 8, 16)["x"] != a["x"]).any()
    assert (
        MixturePlan([data], [1.0], ["pmd"], seed=4).batch(7, "train", 8, 16)["x"] != a["x"]
    ).any()
    assert (plan.batch(7, "val", 8, 16)["x"] != a["x"]).any()


@pytest.mark.parametrize("style", ["pmd", "padded"])
def test_hosts_read_disjoint_slices_of_one_global_batch(tmp_path: Path, style: str) -> None:
    data = _stream(tmp_path)
    other = _prepare(tmp_path, "other", ["zzzz" * 30] * 50, ["zz"])
    plan = MixturePlan([data, other], [0.5, 0.5], [style, style], seed=1)  # type: ignore[list-item]
    whole = plan.batch(3, "train", 12, 24)
    parts = [plan.batch(3, "train", 12, 24, host=h, n_hosts=4) for h in range(4)]
    for key in ("x", "y", "padding_mask"):
        np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_padded_rows_hold_one_document_each(tmp_path: Path) -> None:
    data = _prepare(tmp_path, "docs", ["abc", "defghij", "k" * 100], ["x"])
    plan = MixturePlan([data], [1.0], ["padded"], seed=0)
    batch = plan.batch(0, "train", 16, 8)
    for x, y, mask in zip(batch["x"], batch["y"], batch["padding_mask"], strict=True):
        text = TOK.decode(x[mask])
        assert text in ("abc", "defghij", "k" * 8)
        assert (y[~mask] == IGNORE).all()
        assert (x[~mask] == TOK.pad).all()
        # the target after the last real input token is the document's end or its next byte
        assert (y[mask][:-1] == x[mask][1:]).all()
    assert set(batch["padding_mask"].sum(1).tolist()) == {3, 7, 8}


def test_mixture_follows_its_rates(tmp_path: Path) -> None:
    a = _prepare(tmp_path, "a", ["a" * 200] * 10, ["a" * 50])
    b = _prepare(tmp_path, "b", ["b" * 200] * 10, ["b" * 50])
    plan = MixturePlan([a, b], [0.8, 0.2], ["pmd", "pmd"], seed=0)
    rows = np.concatenate([plan.batch(s, "train", 64, 4)["x"][:, 0] for s in range(50)])
    share = float((rows == ord("a")).mean())
    assert abs(share - 0.8) < 0.03, share  # 3200 rows: 3 sigma is about 0.021


def test_bad_rates_and_styles_are_errors(tmp_path: Path) -> None:
    data = _stream(tmp_path)
    with pytest.raises(ValueError, match="sum to 1"):
        MixturePlan([data, data], [0.5, 0.6], ["pmd", "pmd"], seed=0)
    with pytest.raises(ValueError, match="unknown sampling style"):
        MixturePlan([data], [1.0], ["windows"], seed=0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="too short"):
        MixturePlan([data], [1.0], ["pmd"], seed=0).batch(0, "val", 2, 4096)
    with pytest.raises(ValueError, match="does not split"):
        MixturePlan([data], [1.0], ["pmd"], seed=0).batch(0, "train", 6, 8, n_hosts=4)
