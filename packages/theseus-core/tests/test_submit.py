"""`theseus submit --slurm`: the batch script line by line, cluster profiles, one-line errors.

The scripts are checked against lines written out here by hand for several option
sets (``--dry-run``, which writes and submits nothing); the submission itself, the
requeue and the two tasks' run are in ``tests/test_slurm_submit.py`` on a real SLURM.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from theseus.cli import main

JOBS = str(Path(__file__).with_name("trainer_jobs.py"))
_SCRIPT = Path(sys.executable).with_name("theseus")
# What a script starts theseus with: the console script beside this Python (a venv), else
# this Python itself (an install with pip --target, as on a TPU host).
THESEUS = (
    str(_SCRIPT)
    if _SCRIPT.is_file()
    else f"{sys.executable} -c 'from theseus.cli import main; main()'"
)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with a configuration, no profiles file and no sbatch on PATH."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    done = CliRunner().invoke(
        main, ["--import", JOBS, "configure", "test/synthetic/train", "c.yaml"]
    )
    assert done.exit_code == 0, done.output
    return tmp_path


def _submit(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = CliRunner().invoke(main, ["--import", JOBS, "submit", *args], env=env)
    return done.exit_code, done.output


def _script(here: Path, *args: str) -> list[str]:
    code, out = _submit("r", "c.yaml", "root", "--slurm", *args, "--dry-run")
    assert code == 0, out
    assert not (here / "root" / "slurm").exists()  # a dry run writes nothing
    return out.splitlines()


def _expected(here: Path, lines: list[str], sbatch: list[str], run: str,
              requeues: int = 3, before: list[str] = (),
              lineage: str = "general.default.r") -> list[str]:  # fmt: skip
    folder = f"{here}/root/slurm/r-STAMP"
    return [
        "#!/bin/bash",
        "# Written by theseus submit on DATE.",
        *sbatch,
        f"#SBATCH --output={folder}/slurm-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        *[line for line in lines if line.startswith("#SBATCH --signal")],
        *[line for line in lines if line.startswith("#SBATCH --") and "qos" in line],
        "",
        "set -u",
        f"cd {here}",
        *before,
        f"export THESEUS_PREEMPTION=USR2 THESEUS_REQUEUES={requeues}",
        "restarts=${SLURM_RESTART_COUNT:-0}",
        f'echo "theseus submit: job $SLURM_JOB_ID, run $((restarts + 1)) of at most {requeues + 1}, on $SLURM_JOB_NODELIST"',
        "# one task per GPU (or as asked), each a `theseus run` that joins the others; no",
        "# --kill-on-bad-exit: a warned run exits 140 on every task, each when it is done",
        f"srun --label {THESEUS} run r {folder}/config.yaml {here}/root {run}"
        f"--import {JOBS} --scheduler-lineage '{lineage}~NONCE' "
        '--scheduler-job "$SLURM_JOB_ID" &',
        "tasks=$!",
        "# SLURM warns this shell (--signal=B:...); the tasks checkpoint where all of them stop",
        "trap 'echo \"theseus submit: USR2 before the time limit; checkpointing\"; kill -USR2 $tasks 2>/dev/null' USR2",
        "trap 'kill -TERM $tasks 2>/dev/null' TERM",
        "while :; do",
        "  wait $tasks; code=$?",
        "  kill -0 $tasks 2>/dev/null || break  # a trapped signal ended the wait, not the tasks",
        "done",
        f"if [ $code -eq 140 ] && [ $restarts -lt {requeues} ]; then",
        '  echo "theseus submit: requeued; the next run resumes from the latest checkpoint"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        "exit $code",
    ]  # fmt: skip


def _normal(lines: list[str]) -> list[str]:
    """The script with its date, the submission folder's time stamp and the new
    lineage's nonce made constant."""
    return [
        re.sub(r"~[0-9a-f]{8}'", "~NONCE'",
               re.sub(r"/r-\d{8}-\d{6}/", "/r-STAMP/",
                      re.sub(r" on \d{4}-\d\d-\d\dT[\d:]+\.$", " on DATE.", line)))
        for line in lines
    ]  # fmt: skip


def test_the_plainest_script_asks_for_one_task_and_the_default_warning(here: Path) -> None:
    lines = _normal(_script(here))
    assert "#SBATCH --signal=B:USR2@300" in lines
    want = _expected(
        here,
        lines,
        ["#SBATCH --job-name=r", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1"],
        "",
    )
    assert lines == want


def test_gpus_make_one_task_each_and_every_option_is_a_line(here: Path) -> None:
    given = ["--nodes", "2", "--gpus-per-node", "4", "--cpus-per-task", "8", "--time",
             "12:00:00", "--partition", "gpu", "--account", "proj x", "--sbatch=--qos=high",
             "--requeues", "5", "--signal-seconds", "600", "--project", "p", "--group", "g",
             "optimization/lr=0.001"]  # fmt: skip
    lines = _normal(_script(here, *given))
    # Click hands the KEY=VALUE after the options to the script in the order given
    sbatch = [
        "#SBATCH --job-name=r",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --time=12:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account='proj x'",
    ]
    assert "#SBATCH --signal=B:USR2@600" in lines and "#SBATCH --qos=high" in lines
    want = _expected(
        here,
        lines,
        sbatch,
        "optimization/lr=0.001 --project p --group g ",
        requeues=5,
        lineage="p.g.r",
    )
    assert lines == want


def test_tasks_per_node_wins_over_gpus(here: Path) -> None:
    lines = _script(here, "--gpus-per-node", "8", "--tasks-per-node", "2")
    assert "#SBATCH --ntasks-per-node=2" in lines and "#SBATCH --gpus-per-node=8" in lines


def test_a_profile_gives_defaults_and_the_command_line_wins(here: Path) -> None:
    profiles = here / "config" / "theseus" / "clusters.yaml"
    profiles.parent.mkdir(parents=True)
    profiles.write_text(
        "default: big\n"
        "clusters:\n"
        "  big:\n"
        "    partition: gpu\n"
        "    account: lab\n"
        "    gpus_per_node: 4\n"
        "    modules: [cuda/12.4, nccl]\n"
        "    environment: {NCCL_DEBUG: WARN, MSG: two words}\n"
        "    setup: ['source ~/env/bin/activate']\n"
        "    sbatch: ['--qos=low']\n"
        "  small:\n"
        "    partition: cpu\n"
    )
    lines = _normal(_script(here, "--partition", "debug", "--sbatch=--constraint=a100"))
    assert "#SBATCH --partition=debug" in lines and "#SBATCH --account=lab" in lines
    assert "#SBATCH --ntasks-per-node=4" in lines and "#SBATCH --gpus-per-node=4" in lines
    assert lines.index("#SBATCH --qos=low") + 1 == lines.index("#SBATCH --constraint=a100")
    start = lines.index(f"cd {here}") + 1
    assert lines[start : start + 5] == [
        "module load cuda/12.4",
        "module load nccl",
        "export NCCL_DEBUG=WARN",
        "export MSG='two words'",
        "source ~/env/bin/activate",
    ]
    small = _script(here, "--profile", "small")
    assert "#SBATCH --partition=cpu" in small and not any("account" in x for x in small)


@pytest.mark.parametrize(
    ("text", "profile", "expected"),
    [
        ("clusters:\n  a:\n    partitoin: gpu\n", "a",
         "cluster 'a' sets partitoin, which theseus submit does not know; the settings are nodes,"),
        ("clusters:\n  a:\n    nodes: two\n", "a", "cluster 'a' sets nodes to 'two'; expected a whole number >= 1."),
        ("clusters:\n  a: {}\n", "b", "--profile names the cluster 'b', which"),
        ("default: c\nclusters:\n  a: {}\n", None, "`default:` names the cluster 'c', which"),
        ("partition: gpu\n", None, "expected a mapping with `clusters:` (and optionally `default:`)"),
        ("clusters: [a\n", None, "is not readable YAML ("),
    ],
)  # fmt: skip
def test_a_bad_profile_is_one_line(
    here: Path, text: str, profile: str | None, expected: str
) -> None:
    profiles = here / "config" / "theseus" / "clusters.yaml"
    profiles.parent.mkdir(parents=True)
    profiles.write_text(text)
    code, out = _submit("r", "c.yaml", "root", "--slurm", "--dry-run",
                        *(["--profile", profile] if profile else []))  # fmt: skip
    assert code == 1 and expected in out, out
    assert out.startswith("Error (SubmitError): ") and out.count("\n") == 1, out


def test_refusals_are_one_line_and_write_nothing(here: Path) -> None:
    no_sbatch = {"PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                         if not (Path(p) / "sbatch").exists())}  # fmt: skip
    cases = [
        (["r", "c.yaml", "root"], 2, "theseus submit needs a scheduler: pass --slurm"),
        (["r", "c.yaml", "root", "--slurm", "--nodes", "0"], 2, "expected a whole number >= 1; got 0."),
        (["r", "c.yaml", "root", "--slurm", "--profile", "x"], 1, "--profile x: there is no profiles file at"),
        (["r", "c.yaml", "root", "--slurm", "nokey"], 1, "nokey"),
        (["r", "missing.yaml", "root", "--slurm"], 2, "'missing.yaml' does not exist"),
    ]  # fmt: skip
    for args, code, expected in cases:
        got, out = _submit(*args)
        assert (got, expected in out) == (code, True), out
    got, out = _submit("r", "c.yaml", "root", "--slurm", env=no_sbatch)
    assert got == 1 and "sbatch is not on PATH: submit from a machine with SLURM's commands" in out
    assert out.count("\n") == 1, out
    assert not (here / "root").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["../../evil", "c.yaml", "root"], "Error (InvalidNodeError): "),
        (["r", "c.yaml", "root", "--project", "bad name"], "Error (InvalidNodeError): "),
        (["r", "c.yaml", "root", "architecture/n_layerz=1"], "architecture/n_layerz"),
        (["r", "c.yaml", "root", "architecture/n_layers=-1"], "architecture/n_layers"),
        (["r", "c.yaml", "root", "--sbatch", "--hold\necho INJECTED"],
         "--sbatch: '--hold\\necho INJECTED' is not one sbatch option; give each as one line"),
        (["r", "c.yaml", "root", "--sbatch=qos=x"], "--sbatch: 'qos=x' is not one sbatch option"),
        (["r", "c.yaml", "root", "--sbatch=--nodes=2"],
         "--sbatch: '--nodes=2' sets what the script sets itself; pass --nodes to theseus submit"),
        (["r", "c.yaml", "root", "--sbatch=--no-requeue"], "pass --requeues 0 to theseus submit"),
        (["r", "c.yaml", "root", "--sbatch=-o x.out"], "pass nothing (the log is ROOT/slurm/"),
        (["r", "c.yaml", "root", "--sbatch=-N2"], "pass --nodes to theseus submit"),
    ],
)  # fmt: skip
def test_what_theseus_run_would_refuse_is_refused_before_anything_is_submitted(
    here: Path, args: list[str], expected: str
) -> None:
    code, out = _submit(*args, "--slurm", "--dry-run")
    assert code == 1 and expected in out, out
    assert out.count("\n") == 1, out
    assert (
        sorted(p.name for p in here.iterdir()) == ["c.yaml", "config"]
        or not (here / "root").exists()
    )


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("time: 12:00:00", "time to 43200, a number: YAML reads an unquoted H:MM:SS as seconds; quote it"),
        ("nodes: 0", "sets nodes to 0; expected a whole number >= 1."),
        ("signal_seconds: 0", "sets signal_seconds to 0; expected a whole number >= 1."),
        ("environment: {'A B': '1'}", "sets environment variables named ['A B']; a name is"),
        ('sbatch: ["--x\\n echo hi"]', "sets sbatch: '--x\\n echo hi' is not one sbatch option"),
    ],
)  # fmt: skip
def test_a_profile_is_held_to_what_the_command_line_accepts(
    here: Path, setting: str, expected: str
) -> None:
    profiles = here / "config" / "theseus" / "clusters.yaml"
    profiles.parent.mkdir(parents=True)
    profiles.write_text(f"default: a\nclusters:\n  a:\n    {setting}\n")
    code, out = _submit("r", "c.yaml", "root", "--slurm", "--dry-run")
    assert code == 1 and expected in out, out
    quoted = setting.replace("12:00:00", '"12:00:00"')
    if quoted != setting:  # quoted, it is the time SLURM reads
        profiles.write_text(f"default: a\nclusters:\n  a:\n    {quoted}\n")
        assert "#SBATCH --time=12:00:00" in _script(here)


def test_two_submissions_in_one_second_get_two_folders(tmp_path: Path) -> None:
    from theseus.cli._submit import _new_folder  # the folder a submission makes

    first, second = _new_folder(tmp_path, "r"), _new_folder(tmp_path, "r")
    assert first != second and first.is_dir() and second.is_dir()


def test_resume_sends_a_lineage_on_and_must_be_the_runs(here: Path) -> None:
    from theseus.job import store_root
    from theseus.store import Node, Store

    with Store(store_root(here / "root")) as store:
        for seq in range(3):
            store.touch(Node("general.default.r", "abcdef12", seq))
    lines = _script(here, "--resume", "general.default.r~abcdef12")
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert "--scheduler-lineage 'general.default.r~abcdef12' --scheduler-job" in srun
    code, out = _submit("other", "c.yaml", "root", "--slurm", "--dry-run", "--resume", "r")
    assert code == 1 and out.count("\n") == 1, out
    assert "--resume r continues general.default.r, and this submission names " in out


@pytest.mark.parametrize(
    "limit",
    ["90", "0", "5:30", "12:00:00", "100:59:59", "2-12", "2-23:59", "7-00:00:00", "UNLIMITED"],
)
def test_every_slurm_time_form_is_accepted(here: Path, limit: str) -> None:
    # The six forms of sbatch(1)'s --time (and its "no limit" words), each printed as given.
    assert f"#SBATCH --time={limit}" in _script(here, "--time", limit)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("soon", "--time 'soon' is not a SLURM time limit; expected MINUTES, MM:SS, HH:MM:SS"),
        ("99:99:99", "--time 99:99:99: minutes must be 0-59, got 99; write the limit as"),
        ("10:00:60", "--time 10:00:60: seconds must be 0-59, got 60"),
        ("1-24", "--time 1-24: hours must be 0-23, got 24"),
        ("1-5:60", "--time 1-5:60: minutes must be 0-59, got 60"),
        ("-5", "--time '-5' is not a SLURM time limit"),
        ("1:2:3:4", "--time '1:2:3:4' is not a SLURM time limit"),
        ("12h", "--time '12h' is not a SLURM time limit"),
    ],
)  # fmt: skip
def test_a_time_slurm_would_refuse_is_refused_by_the_dry_run_too(
    here: Path, limit: str, expected: str
) -> None:
    code, out = _submit("r", "c.yaml", "root", "--slurm", "--time", limit, "--dry-run")
    assert code == 1 and out.startswith("Error (SubmitError): ") and expected in out, out
    assert out.count("\n") == 1, out


def test_a_profiles_time_is_checked_as_the_command_lines(here: Path) -> None:
    profiles = here / "config" / "theseus" / "clusters.yaml"
    profiles.parent.mkdir(parents=True)
    profiles.write_text('default: a\nclusters:\n  a:\n    time: "25:61:00"\n')
    code, out = _submit("r", "c.yaml", "root", "--slurm", "--dry-run")
    assert code == 1 and f"{profiles}: time 25:61:00: minutes must be 0-59, got 61" in out, out
    assert "#SBATCH --time=1:00:00" in _script(here, "--time", "1:00:00")  # the command line wins


def test_a_refused_submission_leaves_nothing_behind(here: Path) -> None:
    # A stand-in for sbatch refusing the job (this machine may have no SLURM controller;
    # tests/test_slurm_submit.py checks the same with a real one): it prints sbatch's
    # message and exits 1, as sbatch does for an unknown partition.
    bin_dir = here / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid partition name"
        " specified' >&2\nexit 1\n"
    )
    sbatch.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    code, out = _submit("r", "c.yaml", "root", "--slurm", env=env)
    assert code == 1 and out.count("\n") == 1, out
    assert "sbatch refused the job (exit 1): sbatch: error: Batch job submission failed" in out
    assert "Nothing was submitted." in out
    assert not (here / "root").exists()  # neither ROOT/slurm/RUN-DATE/ nor the folders above
    (here / "root" / "slurm" / "other").mkdir(parents=True)  # an earlier submission's folder
    code, out = _submit("r", "c.yaml", "root", "--slurm", env=env)
    assert code == 1
    assert [p.name for p in (here / "root" / "slurm").iterdir()] == ["other"]
