"""Numbers out of range stop `theseus run`, `configure` and `data prepare` before anything is written.

Each case used to train (one step, or to a loss of hundreds) and exit 0, or to fail
after its first step and leave a failed lineage; now the command exits 1 with one line
that names the key, its range and the value, and the root holds no store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from theseus.cli import main
from theseus.data.datasets import Synthetic

TINY = [
    "architecture.n_layers=1",
    "architecture.n_embd=32",
    "architecture.n_head=2",
    "architecture.block_size=32",
    "training.batch_size=8",
    "training.tokens=512",
    "training.validation_steps=1",
    "logging.validation_interval=1",
]


def _one_line_error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def _root_with_data(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    Synthetic.prepare(root, tokens=20_000, val_tokens=4_000)
    config = tmp_path / "gpt.yaml"
    result = CliRunner().invoke(main, ["configure", "gpt/train/pretrain", str(config)])
    assert result.exit_code == 0, result.output
    return root, config


def _nothing_written(root: Path) -> None:
    assert sorted(p.name for p in root.iterdir()) == ["data"]  # no store, no checkpoints


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("training.tokens=0", "'training/tokens' must be an integer >= 1; got 0."),
        ("training.tokens=-1", "'training/tokens' must be an integer >= 1; got -1."),
        (
            "training.tokens=255",
            "'training/tokens' must be at least one batch, training/batch_size x "
            "architecture/block_size = 8 x 32 = 256 tokens; got 255.",
        ),
        ("training.batch_size=0", "'training/batch_size' must be an integer >= 1; got 0."),
        (
            "logging.validation_interval=0",
            "'logging/validation_interval' must be an integer >= 1; got 0.",
        ),
        ("optimization.lr=-1", "'optimization/lr' must be a finite number > 0; got -1.0."),
        (  # before the bound: a failed lineage and JAX's OverflowError at the first step
            f"training.tokens={2**31 * 256}",
            "'training/tokens' must be at most 2,147,483,647 steps of 256 tokens",
        ),
    ],
)
def test_run_refuses_a_number_out_of_range_before_writing(
    tmp_path: Path, override: str, says: str
) -> None:
    root, config = _root_with_data(tmp_path)
    args = ["run", "bad", str(config), str(root), *TINY, override]
    line = _one_line_error(CliRunner().invoke(main, args))
    assert line.startswith("Error (ConfigRangeError): Configuration value")
    assert says in line
    key = override.split("=")[0]
    assert f"`{key}=" in line  # how to fix it
    _nothing_written(root)


def test_run_refuses_a_number_out_of_range_in_the_file(tmp_path: Path) -> None:
    root, config = _root_with_data(tmp_path)
    values = yaml.safe_load(config.read_text())
    values["optimization"]["lr"] = -1.0
    config.write_text(yaml.safe_dump(values))
    line = _one_line_error(CliRunner().invoke(main, ["run", "bad", str(config), str(root), *TINY]))
    assert "'optimization/lr' must be a finite number > 0; got -1.0." in line
    _nothing_written(root)


def test_configure_refuses_less_than_one_batch_and_writes_no_file(tmp_path: Path) -> None:
    out = tmp_path / "gpt.yaml"
    args = ["configure", "gpt/train/pretrain", str(out), "training.tokens=100"]
    line = _one_line_error(CliRunner().invoke(main, args))
    assert "'training/tokens' must be at least one batch" in line
    assert "= 16 x 128 = 2048 tokens; got 100." in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--tokens", "-5"], "--tokens of synthetic must be an integer >= 1; got '-5'."),
        (["--val-tokens", "0"], "--val-tokens of synthetic must be an integer >= 1; got '0'."),
        (
            ["--concentration", "nan"],
            "--concentration of synthetic must be a finite number > 0; got 'nan'.",
        ),
        (["--order", "9"], "--order of synthetic must be an integer >= 1 and <= 4; got '9'."),
        (["--tokens"], "--tokens of synthetic expects an integer; got True."),
    ],
)
def test_data_prepare_refuses_an_option_out_of_range(
    tmp_path: Path, option: list[str], says: str
) -> None:
    root = tmp_path / "root"
    args = ["data", "prepare", "synthetic", "--root", str(root), *option]
    line = _one_line_error(CliRunner().invoke(main, args))
    assert says in line
    assert f"`theseus data prepare synthetic --root ROOT {option[0]} " in line
    assert not root.exists()


def test_a_run_whose_loss_is_no_longer_finite_fails_and_says_so(tmp_path: Path) -> None:
    """`optimization/lr=1e30` is in range (> 0) but diverges: the run trained to a NaN loss
    and ended `finished` with exit 0. Now the first report of a non-finite loss fails it."""
    root, config = _root_with_data(tmp_path)
    settings = [*TINY, "optimization.lr=1e30", "logging.report_interval=1"]
    settings = [s for s in settings if not s.startswith("training.tokens=")]
    args = ["run", "diverge", str(config), str(root), *settings, "training.tokens=2560"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "the run diverged. Lower optimization/lr (now 1e+30)" in result.output
    from theseus.store import Store

    with Store(root / "store") as store:
        nodes = sorted(store.query().spec(run="diverge").all(), key=lambda n: n.seq)
        last = store.values(nodes[-1])
        assert last["job/status"] == "failed" and "diverged" in str(last["job/error"])
        losses = [store.values(n).get("train/loss") for n in nodes]
        assert any(loss is not None and loss != loss for loss in losses)  # NaN recorded
        assert len(nodes) < 10  # stopped at the first report, not after all 10 steps
