"""The theseus command line: jobs, configure, run (fresh/resume/branch), data prepare, plug-ins."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from theseus.cli import main
from theseus.config import load
from theseus.registry import DATASETS, dataset
from theseus.store import Node, Store

JOBS_FILE = str(Path(__file__).with_name("core_jobs.py"))


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=True)


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def fail(*args: str) -> str:
    """Run a command that must fail; return its one-paragraph error."""
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error (") and lines[0].endswith(
        "(Run with --debug for the traceback.)"
    )
    return lines[0]


def configured(tmp_path: Path, *overrides: str, name: str = "counter.yaml") -> Path:
    out = tmp_path / name
    ok("configure", "tests/counter", str(out), "--import", JOBS_FILE, *overrides)
    return out


def store_of(root: Path) -> Store:
    return Store(root / "store")


def test_jobs_lists_registered_jobs_with_their_summary() -> None:
    result = ok("--import", JOBS_FILE, "jobs", "tests/")
    lines = result.output.splitlines()
    assert lines == [
        "tests/counter  Doubles a value every tick and checkpoints it.",
        "tests/inspect  Reads the counter's value at its node and stores it as an artifact.",
    ]
    assert ok("jobs", "tests/c", "--import", JOBS_FILE).output.splitlines() == lines[:1]
    assert "No jobs registered starting with 'zzz'" in ok("jobs", "zzz").output


def test_configure_writes_the_full_configuration(tmp_path: Path) -> None:
    out = configured(tmp_path, "counter.steps=4", "counter/start=0.5")
    text = out.read_text()
    assert text.splitlines()[0] == "job: tests/counter"
    assert load(out) == {
        "job": "tests/counter",
        "counter": {"steps": 4, "start": 0.5, "fail_at": -1},
    }
    assert "# int: ticks to run" in text


def test_configure_notes_required_values(tmp_path: Path) -> None:
    (tmp_path / "needs.py").write_text(
        "from dataclasses import dataclass\n"
        "from theseus.config import field\n"
        "from theseus.job import BasicJob\n"
        "from theseus.registry import job\n"
        "@dataclass\n"
        "class C:\n"
        "    seed: int = field('data/seed')\n"
        "@job('tests/cli/needs')\n"
        "class Needs(BasicJob):\n"
        "    CONFIG = C\n"
        "    def run(self):\n"
        "        return self.args.seed\n"
    )
    out = tmp_path / "needs.yaml"
    result = ok("configure", "tests/cli/needs", str(out), "--import", str(tmp_path / "needs.py"))
    assert "Fill in before running (required, no default): data/seed." in result.output
    assert "seed: null  # REQUIRED int" in out.read_text()
    message = fail(
        "run", "r", str(out), str(tmp_path / "root"), "--import", str(tmp_path / "needs.py")
    )
    assert "ConfigError" in message and "data/seed" in message and "data.seed=VALUE" in message
    result = ok(
        "run",
        "r",
        str(out),
        str(tmp_path / "root"),
        "data.seed=7",
        "--import",
        str(tmp_path / "needs.py"),
    )
    assert "fresh run finished" in result.output


def test_run_fresh_resume_and_branch(tmp_path: Path) -> None:
    config = configured(tmp_path, "counter.steps=2")
    root = tmp_path / "root"
    fresh = ok(
        "run",
        "train",
        str(config),
        str(root),
        "--import",
        JOBS_FILE,
        "--project",
        "p",
        "--group",
        "g",
    )
    store = store_of(root)
    end = store.query().spec(project="p", group="g", run="train").latest().first()
    assert end is not None and end.seq == 2
    assert f"tests/counter: fresh run finished at node {end}." in fresh.output
    assert store.values(end) == {
        "counter/value": 4.0,
        "job/status": "finished",
        "job/name": "tests/counter",
        "job/module": "core_jobs",
    }

    resumed = ok(
        "run", "train", str(config), str(root), "--resume", str(end), "--import", JOBS_FILE
    )
    assert "resume run finished" in resumed.output
    last = store.query().nonce(end.nonce).latest().first()
    assert last is not None and last.seq == 4
    assert store.values(last)["counter/value"] == 16.0
    # the short form `theseus-store runs` prints (name~nonce) means the lineage's last node
    again = ok(
        "run",
        "train",
        str(config),
        str(root),
        "--resume",
        f"{end.name}~{end.nonce}",
        "--import",
        JOBS_FILE,
    )
    assert "resume run finished" in again.output
    assert store.query().nonce(end.nonce).latest().first().seq == 6  # type: ignore[union-attr]

    # a resumed lineage keeps its name: a RUN or --project that names another is refused
    lineage = f"{end.name}~{end.nonce}"
    for args, said in (
        (("other",), "names RUN other. Pass RUN train to continue it"),
        (("train", "--project", "q"), "names --project q. Pass --project p to continue it"),
    ):
        cli = (args[0], str(config), str(root), *args[1:], "--resume", lineage)
        result = invoke("run", *cli, "--import", JOBS_FILE)
        assert result.exit_code == 2 and said in result.output, result.output
        assert f"--branch {lineage}" in result.output
    # the run's name alone stands for p.g.train beside a nonce; another run's name does not
    assert store.resolve(f"train~{end.nonce}") == store.resolve(lineage)
    short = fail("run", "train", str(config), str(root), "--resume", f"other~{end.nonce}",
                 "--import", JOBS_FILE)  # fmt: skip
    assert f"lineage {end.nonce} is p.g.train~{end.nonce}" in short
    beyond = fail("run", "train", str(config), str(root), "--resume", f"{lineage}~99",
                  "--import", JOBS_FILE)  # fmt: skip
    assert (
        f"The store has no node {lineage}~99: the 7 nodes of lineage {lineage} run from seq 0 to 6"
        in beyond
    )
    assert f"`theseus-store lineage {store.root} {lineage}` lists them" in beyond
    assert store.query().nonce(end.nonce).latest().first().seq == 6  # type: ignore[union-attr]
    # the run's name alone: its one lineage, from its last checkpoint
    alone = ok("run", "train", str(config), str(root), "--resume", "train", "--import", JOBS_FILE)
    assert f"resume run finished at node {lineage}~8" in alone.output

    branched = ok(
        "run",
        "side",
        str(config),
        str(root),
        "counter.steps=1",
        "--branch",
        str(end),
        "--import",
        JOBS_FILE,
    )
    assert "branch run finished" in branched.output
    side = store.query().spec(run="side").latest().first()
    assert side is not None and side.seq == 1 and side.nonce != end.nonce
    first = store.query().spec(run="side").seq(0).first()
    assert first is not None and store.parents(first) == [end]
    assert store.values(side)["counter/value"] == 8.0
    saved = yaml.safe_load(store.job_config(side) or "")
    assert saved["counter"]["steps"] == 1
    store.close()


def test_run_notes_file_values_that_the_saved_configuration_overrides(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ok(
        "run",
        "train",
        str(configured(tmp_path, "counter.steps=1")),
        str(root),
        "--import",
        JOBS_FILE,
    )
    end = store_of(root).query().latest().first()
    assert end is not None
    other = configured(tmp_path, "counter.start=5", name="other.yaml")  # steps: the default
    result = ok("run", "train", str(other), str(root), "--resume", str(end), "--import", JOBS_FILE)
    assert (
        "1 setting(s) of" in result.stderr
        and "differ from the configuration saved" in result.stderr
    )
    assert "counter/start" in result.stderr
    assert "counter/steps" not in result.stderr  # left at its default in the file: not chosen
    last = store_of(root).query().latest().first()
    assert (
        last is not None and store_of(root).values(last)["counter/value"] == 4.0
    )  # start stayed 1.0


def test_run_errors_are_one_paragraph(tmp_path: Path) -> None:
    config = configured(tmp_path)
    root = str(tmp_path / "root")
    message = fail("run", "r", str(config), root, "counter.stepz=2", "--import", JOBS_FILE)
    assert "UnknownKeyError" in message and "Did you mean 'counter/steps'" in message
    message = fail("run", "r", str(config), root, "counter.steps=two", "--import", JOBS_FILE)
    assert "'counter/steps' must be int; got 'two'" in message
    message = fail("run", "r", str(config), root, "counter.steps", "--import", JOBS_FILE)
    assert "key=value" in message
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("counter: {steps: 1}\n")
    message = fail("run", "r", str(unnamed), root, "--import", JOBS_FILE)
    assert "top-level `job: NAME`" in message and "theseus configure JOB" in message
    message = fail(
        "run", "r", str(config), root, "--resume", "general.default.r~abc~0", "--import", JOBS_FILE
    )
    assert "no lineage general.default.r~abc" in message and "theseus-store runs" in message
    message = fail("run", "r", str(config), root, "--resume", "not-a-node", "--import", JOBS_FILE)
    assert "holds no runs yet, so none named 'not-a-node'" in message  # a new root
    message = fail("run", "r", str(config), root, "--resume", "a~b~c~d", "--import", JOBS_FILE)
    assert "InvalidNodeError" in message
    message = fail("configure", "tests/countr", str(tmp_path / "x.yaml"), "--import", JOBS_FILE)
    assert "Did you mean 'tests/counter'" in message
    message = fail("--import", str(tmp_path / "absent.py"), "jobs")
    assert "ImportFailedError" in message and "no such file" in message
    result = invoke("run", "r", str(config), root, "--resume", "a", "--branch", "b")
    assert result.exit_code == 2 and "at most one of --resume" in result.output


def test_debug_shows_the_exception(tmp_path: Path) -> None:
    config = configured(tmp_path)
    result = invoke(
        "--debug", "run", "r", str(config), str(tmp_path), "counter.x=1", "--import", JOBS_FILE
    )
    assert result.exit_code == 1
    assert type(result.exception).__name__ == "UnknownKeyError"
    assert "Run with --debug" not in result.output


@pytest.fixture
def tiny_dataset() -> Iterator[list[tuple[Path, dict[str, object]]]]:
    calls: list[tuple[Path, dict[str, object]]] = []

    @dataset("tests-cli-tiny")
    class Tiny:
        @classmethod
        def prepare(cls, root: Path, **options: object) -> None:
            calls.append((root, options))

    yield calls
    DATASETS.unregister("tests-cli-tiny")


def test_data_prepare_passes_options(
    tmp_path: Path, tiny_dataset: list[tuple[Path, dict[str, object]]]
) -> None:
    result = ok(
        "data",
        "prepare",
        "tests-cli-tiny",
        "--root",
        str(tmp_path),
        "--source",
        "dir",
        "--force",
        "--n=3",
    )
    assert tiny_dataset == [(tmp_path, {"source": "dir", "force": True, "n": "3"})]
    assert "Prepared tests-cli-tiny" in result.output


def test_data_prepare_unknown_dataset_lists_known_ones(
    tiny_dataset: object, tmp_path: Path
) -> None:
    message = fail("data", "prepare", "tests-cli-tiyn", "--root", str(tmp_path))
    assert "No dataset is registered as 'tests-cli-tiyn'" in message
    assert "Did you mean 'tests-cli-tiny'" in message
    assert "tests-cli-tiny" in message.split("Registered:")[1]
    assert "theseus data prepare NAME --root ROOT" in message
    message = fail("data", "prepare", "tests-cli-tiny", "--root", str(tmp_path), "stray")
    assert "--name VALUE" in message


def test_plugin_commands_load_from_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "theseus_plugin_demo.py").write_text(
        "import click\n"
        "@click.command()\n"
        "@click.argument('who')\n"
        "def hello(who):\n"
        "    '''Say hello.'''\n"
        "    click.echo(f'hello {who}')\n"
        "not_a_command = 3\n"
    )
    info = tmp_path / "theseus_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: theseus-plugin-demo\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[theseus.cli]\nhello = theseus_plugin_demo:hello\nbroken = theseus_plugin_demo:not_a_command\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    listing = ok("--help").output
    assert "hello" in listing and "Say hello." in listing
    assert "broken" in listing and "(cannot load:" in listing
    assert ok("hello", "world").output == "hello world\n"
    message = fail("broken")
    assert "must be a click command or group; got int" in message
    monkeypatch.delitem(sys.modules, "theseus_plugin_demo", raising=False)


def test_help_lists_each_command_in_full_and_points_at_theseus_store() -> None:
    listing = ok("--help").output
    assert "..." not in listing.split("Commands:")[1]  # no description cut short
    described = " ".join(listing.split())  # the descriptions are wrapped
    assert (
        "run Run the job CONFIG.yaml names (its top-level `job:` key) as run RUN under ROOT."
        in (described)
    )
    assert "`theseus-store runs ROOT`" in described and "theseus-store --help" in described


def test_a_real_subprocess_runs_the_console_script(tmp_path: Path) -> None:
    config = configured(tmp_path, "counter.steps=1")
    exe = Path(sys.executable).with_name("theseus")
    if not exe.is_file():  # installed with pip --target (a TPU host): the script is on PATH
        exe = Path(shutil.which("theseus") or exe)
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    done = subprocess.run(
        [str(exe), "run", "sub", str(config), str(tmp_path / "root"), "--import", JOBS_FILE],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    end = Node.deserialize(done.stdout.strip().rsplit(" ", 1)[-1].rstrip("."))
    assert store_of(tmp_path / "root").values(end) == {
        "counter/value": 2.0,
        "job/status": "finished",
        "job/name": "tests/counter",
        "job/module": "core_jobs",
    }
    crashed = subprocess.run(
        [
            str(exe),
            "--debug",
            "run",
            "sub",
            str(config),
            str(tmp_path / "root"),
            "counter.fail_at=0",
            "--import",
            JOBS_FILE,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert crashed.returncode == 1
    assert "Traceback" in crashed.stderr and "planned failure at step 0" in crashed.stderr
    failed = store_of(tmp_path / "root").query().where("job/status", "=", "failed").all()
    assert len(failed) == 1 and failed[0].seq == 0


def test_configure_keeps_a_file_that_holds_other_settings_unless_forced(tmp_path: Path) -> None:
    out = configured(tmp_path)
    configured(tmp_path)  # the same settings again: written, nothing lost
    edited = out.read_text().replace("steps: ", "steps: 9  # mine\n# was: ", 1)
    out.write_text(edited)
    message = fail("configure", "tests/counter", str(out), "--import", JOBS_FILE)
    assert message.startswith(f"Error (FileExistsError): {out} exists and holds other settings")
    assert "nothing was written. Pass --force to replace it" in message
    assert out.read_text() == edited
    fail("configure", "tests/counter", str(out), "--import", JOBS_FILE, "counter.steps=9")
    assert out.read_text() == edited

    ok("configure", "tests/counter", str(out), "--import", JOBS_FILE, "--force")
    assert out.read_text() == configured(tmp_path / "b").read_text()  # the defaults again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "counter.yaml"]  # no temporary


def test_a_configuration_write_cut_short_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = configured(tmp_path)
    before = out.read_bytes()

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    result = invoke("configure", "tests/counter", str(out), "--import", JOBS_FILE, "--force",
                    "counter.steps=9")  # fmt: skip
    assert result.exit_code == 1 and "No space left on device" in result.stderr
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["counter.yaml"]
