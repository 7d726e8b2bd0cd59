"""Preparing the built-in datasets from generated and local files, offline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from theseus.data.datasets import FineWeb, SourceError, Synthetic, TextFiles
from theseus.data.prepared import DataNotPreparedError, PreparedData
from theseus.data.tokenizer import ByteTokenizer
from theseus.registry import DATASETS
from theseus.training.flywheel.strategy import Sampling, normalize, plan

TOK = ByteTokenizer()


def test_builtins_are_registered_for_the_command_line() -> None:
    assert DATASETS["synthetic"] is Synthetic
    assert DATASETS["fineweb"] is FineWeb
    assert DATASETS["text"] is TextFiles


def test_synthetic_prepares_the_requested_sizes_and_records_its_bound(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens="20000", val_tokens=3000, seed=5)
    data = Synthetic.open(tmp_path)
    assert data.header["count"] == {"train": 20000, "val": 3000}
    language = Synthetic.language(tmp_path)
    assert language.seed == 5
    assert Synthetic.entropy_bound(tmp_path) == pytest.approx(language.entropy_bound(), rel=1e-12)
    assert data.header["meta"]["entropy_bound"] == pytest.approx(
        language.entropy_bound(), rel=1e-12
    )
    np.testing.assert_array_equal(data.tokens("train"), language.sample_tokens(20000, seed=1))


def test_synthetic_rejects_unknown_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synthetic has no option --vocabulary; its options are"):
        Synthetic.prepare(tmp_path, vocabulary=3)
    with pytest.raises(ValueError, match="expects an integer"):
        Synthetic.prepare(tmp_path, tokens="many")


def test_fineweb_reads_parquet_records_the_test_wrote(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    texts = [f"document number {i}: " + "xyz" * i for i in range(40)]
    pq.write_table(pa.table({"id": list(range(40)), "text": texts}), source / "part-0.parquet")
    FineWeb.prepare(tmp_path / "root", source=str(source), val_fraction="0.1")
    data = FineWeb.open(tmp_path / "root")
    every = 10
    val = [t for i, t in enumerate(texts) if i % every == every - 1]
    train = [t for i, t in enumerate(texts) if i % every != every - 1]
    np.testing.assert_array_equal(data.tokens("train"), TOK.encode_batch(train))
    np.testing.assert_array_equal(data.tokens("val"), TOK.encode_batch(val))
    assert data.header["meta"]["documents"] == 40


def test_fineweb_reads_jsonl_and_reports_bad_lines(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.jsonl").write_text(
        "\n".join(json.dumps({"text": f"t{i}"}) for i in range(4)) + "\n"
    )
    FineWeb.prepare(tmp_path / "root", source=source, val_fraction=0)
    assert TOK.decode(FineWeb.open(tmp_path / "root").tokens("train")) == "t0t1t2t3"
    (source / "b.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(SourceError, match=r"b\.jsonl:2 has no 'text' field"):
        FineWeb.prepare(tmp_path / "root2", source=source)


def test_misspelt_options_are_errors_not_ignored(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="fineweb has no option --val-fractoin"):
        FineWeb.prepare(tmp_path, source=source, val_fractoin="0.1")
    with pytest.raises(ValueError, match="text has no option --sources"):
        TextFiles.prepare(tmp_path, sources=source)


def test_missing_sources_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="--source DIR"):
        FineWeb.prepare(tmp_path)
    with pytest.raises(SourceError, match=r"no \.parquet or \.jsonl files"):
        FineWeb.prepare(tmp_path, source=tmp_path)
    with pytest.raises(
        DataNotPreparedError, match=r"theseus data prepare fineweb --root .* --source DIR"
    ):
        FineWeb.open(tmp_path)


def test_text_files_are_one_document_each(tmp_path: Path) -> None:
    source = tmp_path / "corpus"
    source.mkdir()
    for i in range(4):
        (source / f"{i}.txt").write_text(f"file {i}")
    TextFiles.prepare(tmp_path, source=source, val_fraction=0.5)
    data = PreparedData.open(tmp_path, "text")
    assert TOK.decode(data.tokens("train")) == "file 0file 2"
    assert TOK.decode(data.tokens("val")) == "file 1file 3"


def test_sampling_declarations_normalize_and_check_rates(tmp_path: Path) -> None:
    assert normalize(Synthetic) == [Sampling(Synthetic, 1.0, "pmd")]
    assert normalize([]) == []
    with pytest.raises(ValueError, match=r"sum to 1, got Synthetic=0.5, FineWeb=0.2"):
        normalize([Sampling(Synthetic, 0.5), Sampling(FineWeb, 0.2)])
    with pytest.raises(TypeError, match="dataset class"):
        Sampling("synthetic", 1.0)  # type: ignore[arg-type]
    with pytest.raises(DataNotPreparedError, match="theseus data prepare synthetic"):
        plan(Sampling(Synthetic, 1.0, "pmd"), tmp_path, seed=0)
    Synthetic.prepare(tmp_path, tokens=5000, val_tokens=1000)
    batch = plan([Sampling(Synthetic, 1.0, "padded")], tmp_path, seed=0)
    assert batch is not None
    assert batch.batch(0, "train", 4, 16)["x"].shape == (4, 16)


def test_the_command_an_error_prints_can_be_pasted_into_a_shell(tmp_path: Path) -> None:
    import shlex
    import shutil
    import subprocess
    import sys

    root = tmp_path / "with space's"
    with pytest.raises(DataNotPreparedError) as caught:
        Synthetic.open(root)
    command = str(caught.value).splitlines()[-1].strip()
    # the shell splits the printed command back into the same words, the root whole
    argv = shlex.split(command)
    assert argv[:4] == ["theseus", "data", "prepare", "synthetic"] and argv[5] == str(root)
    exe = Path(sys.executable).with_name("theseus")
    if not exe.is_file():  # installed with pip --target (a TPU host): the script is on PATH
        exe = Path(shutil.which("theseus") or exe)
    done = subprocess.run(
        [*shlex.split(command.replace("theseus", shlex.quote(str(exe)), 1)), "--tokens", "2000",
         "--val-tokens", "500"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Synthetic.open(root).header["count"] == {"train": 2000, "val": 500}


def test_too_few_documents_to_hold_one_out_is_refused_at_prepare(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from theseus.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "only.txt").write_text("one long document " * 100)
    with pytest.raises(SourceError, match=r"1 document\(s\) .* leave no validation text"):
        TextFiles.prepare(tmp_path / "root", source=corpus)
    assert not (tmp_path / "root" / "data" / "text" / "header.json").exists()
    for i in range(20):
        (corpus / f"{i}.txt").write_text(f"document {i} " * 10)
    result = CliRunner().invoke(
        main, ["data", "prepare", "text", "--root", str(tmp_path / "root"), "--source", str(corpus)]
    )
    assert result.exit_code == 0, result.output
    header = TextFiles.open(tmp_path / "root").header["count"]
    assert f"{header['train']:,} training and {header['val']:,} validation tokens" in result.output
    assert header["val"] > 0


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and inode: what a second preparation must leave alone."""
    return {p.name: (p.read_bytes(), p.stat().st_ino) for p in sorted(folder.iterdir())}


def test_preparing_the_same_tokens_again_writes_nothing(tmp_path: Path) -> None:
    folder = Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500)
    before = _files(folder)
    assert Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500) == folder
    assert _files(folder) == before


def test_other_tokens_never_replace_a_prepared_dataset_unless_asked(tmp_path: Path) -> None:
    """The runs of a root read its data again on resume and in analyses: a second
    preparation with other settings is refused and leaves every file as it was;
    inside `replacing()` it replaces them, and the header's digest is the sha256 of
    the new token files' bytes."""
    import hashlib

    from theseus.data import DataError, replacing

    folder = Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500)
    before = _files(folder)
    with pytest.raises(DataError) as refused:
        Synthetic.prepare(tmp_path, tokens=4_000, val_tokens=500, seed=3)
    message = str(refused.value)
    assert "\n" not in message
    # what differs, from the two headers' settings: the count and the language's seed
    assert "count.train 3,000 -> 4,000" in message and "language.seed 0 -> 3" in message
    assert "--replace" in message
    assert _files(folder) == before
    with replacing():
        Synthetic.prepare(tmp_path, tokens=4_000, val_tokens=500, seed=3)
    header = json.loads((folder / "header.json").read_text())
    assert header["count"] == {"train": 4000, "val": 500}
    expected = hashlib.sha256(
        (folder / "train.bin").read_bytes() + (folder / "val.bin").read_bytes()
    )
    assert header["digest"] == f"sha256:{expected.hexdigest()}"
    with pytest.raises(DataError):  # outside the block, refused again
        Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500)


def test_a_header_written_before_the_digest_is_compared_by_its_files(tmp_path: Path) -> None:
    from theseus.data import DataError

    folder = Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500)
    header = json.loads((folder / "header.json").read_text())
    del header["digest"]
    (folder / "header.json").write_text(json.dumps(header))
    before = _files(folder)
    Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500)
    assert _files(folder) == before
    with pytest.raises(DataError, match="already holds other prepared tokens"):
        Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500, seed=5)
    assert _files(folder) == before
    header["tokenizer"] = "gpt2"  # ... and prepared in another tokenizer: never compared
    (folder / "header.json").write_text(json.dumps(header))
    before = _files(folder)
    with pytest.raises(DataError, match=r"\(sha256 unknown there, [0-9a-f]{12} these: "):
        Synthetic.prepare(tmp_path, tokens=3_000, val_tokens=500)
    assert _files(folder) == before


def test_the_command_keeps_prepared_tokens_unless_told_to_replace_them(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from theseus.cli import main

    def prepare(*extra: str) -> tuple[int, str]:
        args = ["data", "prepare", "synthetic", str(tmp_path), "--tokens", "3000"]
        done = CliRunner().invoke(main, [*args, "--val-tokens", "500", *extra])
        return done.exit_code, done.output

    assert prepare() == (
        0,
        f"Prepared synthetic under {tmp_path}: 3,000 training and 500 validation tokens "
        "(bytes tokenizer).\n",
    )
    folder = tmp_path / "data" / "synthetic"
    before = _files(folder)
    code, out = prepare()
    assert code == 0 and "already holds these tokens" in out and "nothing written" in out
    code, out = prepare("--seed", "4")
    assert code != 0 and "already holds other prepared tokens" in out and "--replace" in out
    assert _files(folder) == before
    old = json.loads((folder / "header.json").read_text())["digest"]
    code, out = prepare("--seed", "4", "--replace")
    assert code == 0 and out.startswith("Prepared synthetic under")
    assert json.loads((folder / "header.json").read_text())["meta"]["language"]["seed"] == 4
    # it says what it replaced, and what that means for the runs trained on it
    (said,) = [line for line in out.splitlines() if line.startswith("Replaced ")]
    assert f"(sha256 {old.removeprefix('sha256:')[:12]}: " in said
    assert "language.seed 0 -> 4" in said and "resume training only once" in said
