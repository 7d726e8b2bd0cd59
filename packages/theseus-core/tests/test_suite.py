"""A training suite imported as one lineage: revisions found, ordered by step, hashed, flagged.

References: revision names are built from numbers and must parse back to them
(hypothesis); the Hugging Face cache is laid out in the test as `huggingface_hub`
caches a repository (suite_folders.py); tensor digests are `hashlib.sha256` of each
array's bytes as NumPy holds them (independent of the file parsing under test); the
weights restored at every node equal the revision folder's tensors exactly (float32
in, float32 out).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from theseus.cli import main
from theseus.experiments.models._integrity import (
    Fingerprint,
    check,
    digest_of,
    fingerprint,
    table,
    tensor_digests,
)
from theseus.experiments.models._revisions import RevisionError, discover, parse_name, select
from theseus.experiments.models.suite import HFSuite, import_suite
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

pytestmark = pytest.mark.tokenizers

HERE = Path(__file__).parent
folders = import_module_or_file(str(HERE / "gpt2_folder.py"))
suites = import_module_or_file(str(HERE / "suite_folders.py"))

SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


# ------------------------------------------------------------------------ names
@settings(max_examples=60, deadline=None, database=None)
@given(
    step=st.integers(0, 10**9),
    tokens=st.none() | st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(SUFFIX))),
    stage=st.none() | st.integers(0, 99),
    dash=st.sampled_from(["", "-", "_"]),
    case=st.sampled_from(["step", "Step", "STEP"]),
)
def test_step_and_tokens_parse_back_from_names_built_from_numbers(
    step: int, tokens: tuple[int, str] | None, stage: int | None, dash: str, case: str
) -> None:
    parts = [] if stage is None else [f"stage{stage}"]
    parts.append(f"{case}{dash}{step}")
    if tokens is not None:
        parts.append(f"tokens{tokens[0]}{tokens[1]}")
    name = "-".join(parts)
    expected_tokens = None if tokens is None else tokens[0] * SUFFIX[tokens[1]]
    parsed = parse_name(name)
    assert parsed == (step, expected_tokens)
    assert all(type(x) is int for x in parsed if x is not None)  # numbers, not strings


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("step1000", (1000, None)),
        ("step-1000", (1000, None)),
        ("stage1-step11931-tokens50B", (11931, 50 * 10**9)),
        ("stage2-ingredient1-step23852-tokens100B", (23852, 100 * 10**9)),
        ("step1000-tokens1.5B", (1000, 1_500_000_000)),
        ("tokens12B-step7", (7, 12 * 10**9)),
        ("main", (None, None)),
        ("steps", (None, None)),
        ("mystep1000", (None, None)),  # `step` must start a part of the name
        ("step1-step2", (None, None)),  # two steps: the name does not say which
    ],
)
def test_revision_names(name: str, expected: tuple[int | None, int | None]) -> None:
    assert parse_name(name) == expected


# -------------------------------------------------------------------- discovery
def _suite(base: Path, seeds: dict[str, int]) -> dict[str, Path]:
    """One random GPT-2 folder per revision; equal seeds give identical weights."""
    return {
        name: folders.write_gpt2_folder(base / name, n_layer=1, n_embd=16, n_head=2, seed=seed)
        for name, seed in seeds.items()
    }


@pytest.fixture(scope="module")
def revisions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("revisions")
    return _suite(
        base / "src", {"step0": 0, "step1000": 1, "step2000": 1, "step4000": 3, "main": 3}
    )


def test_a_hugging_face_cache_lists_its_refs_and_all_takes_the_steps(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    stepped = {k: v for k, v in revisions.items() if k != "main"}
    cache = suites.hf_cache(tmp_path / "models--org--tiny", stepped, aliases={"main": "step4000"})
    with pytest.raises(
        RevisionError,
        match=r"cache of several repositories; pass the folder of "
        r"one: .*models--org--tiny$",
    ):
        discover(tmp_path)  # the hub's folder, not the repository's
    (cache / "refs" / "pr").mkdir()
    (cache / "refs" / "pr" / "1").write_text("0" * 40)  # a pull request: not a revision
    found = discover(cache)
    assert [r.name for r in found] == ["main", "step0", "step1000", "step2000", "step4000"]
    by_name = {r.name: r for r in found}
    assert by_name["main"].folder == by_name["step4000"].folder  # one commit, one snapshot
    assert (by_name["step1000"].folder / "config.json").is_symlink()
    assert [r.name for r in select(found, "all")] == ["step0", "step1000", "step2000", "step4000"]
    assert [r.name for r in select(found, "main, step2000,step0")] == ["step0", "step2000", "main"]
    with pytest.raises(
        RevisionError,
        match=r"^revision 'step3000' is not in the suite; it has "
        r"step0, step1000, step2000, step4000, main$",
    ):
        select(found, "step0,step3000")
    with pytest.raises(RevisionError, match="expected all, or revision names separated"):
        select(found, "step0,,step1000")


def test_folders_that_are_not_suites_are_one_line(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(
        RevisionError, match=r"is one model's folder .* not a suite; drop --revisions"
    ):
        discover(revisions["step0"])
    with pytest.raises(RevisionError, match="is not a folder"):
        discover(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RevisionError, match="holds no revision"):
        discover(tmp_path / "empty")
    only_main = tmp_path / "only-main"
    only_main.mkdir()
    (only_main / "main").symlink_to(revisions["main"])
    with pytest.raises(RevisionError, match="none of main does; name the ones to import"):
        select(discover(only_main), "all")


def test_a_suite_imported_as_one_model_says_how_to_import_a_suite(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    stepped = {k: v for k, v in revisions.items() if k != "main"}
    cache = suites.hf_cache(tmp_path / "models--org--tiny", stepped)
    src = tmp_path / "src"
    src.mkdir()
    (src / "step0").symlink_to(revisions["step0"])
    for folder in (cache, src):
        root = tmp_path / f"root-{folder.name}"
        result = CliRunner().invoke(main, ["import", "hf", str(folder), str(root)])
        assert result.exit_code != 0
        message = result.output
        assert "holds a training suite of" in message and "--revisions all" in message
        assert "step0" in message and "\n" not in message.strip()
        assert not root.exists()  # nothing written
    (tmp_path / "plain").mkdir()  # neither a model nor a suite: the folder's own message
    result = CliRunner().invoke(main, ["import", "hf", str(tmp_path / "plain"), str(root)])
    assert "has no config.json" in result.output


def test_two_revisions_at_one_step_are_refused(revisions: dict[str, Path], tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "step1000").symlink_to(revisions["step1000"])
    (src / "step-1000").symlink_to(revisions["step2000"])
    with pytest.raises(RevisionError, match="step-1000 and step1000 both name step 1000"):
        select(discover(src), "all")


# ---------------------------------------------------------------------- hashing
def test_tensor_digests_are_the_sha256_of_each_tensors_bytes(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors.numpy import load_file

    folder = tmp_path / "sharded"
    folder.mkdir()
    for file in revisions["step0"].iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    arrays = load_file(str(folder / "model.safetensors"))
    shards = suites.reshard(folder, 3)
    expected = {name: hashlib.sha256(a.tobytes()).hexdigest() for name, a in arrays.items()}
    found: dict[str, str] = {}
    for shard in shards:
        found.update(tensor_digests(shard))
    assert found == expected
    lines = "".join(f"{name}\t{expected[name]}\n" for name in sorted(expected))
    print_ = fingerprint("step0", 0, shards)
    assert print_.sha256 == hashlib.sha256(lines.encode()).hexdigest() == digest_of(expected)
    assert len(print_.shards) == 3
    # The same weights in one file or in three have the same weights digest.
    assert fingerprint("step0", 0, [revisions["step0"] / "model.safetensors"]).sha256 == (
        print_.sha256
    )
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(shards[0].read_bytes()[:-10])
    with pytest.raises(RevisionError, match=r"ends inside tensor .* truncated"):
        tensor_digests(truncated)


def test_check_flags_duplicates_shared_shards_and_gaps() -> None:
    prints = [
        Fingerprint("step0", 0, "a", ("a1", "a2")),
        Fingerprint("step1000", 1000, "b", ("b1", "b2")),
        Fingerprint("step2000", 2000, "b", ("b1", "b2")),
        Fingerprint("step3000", 3000, "b", ("b1", "b2")),
        Fingerprint("step6000", 6000, "c", ("c1", "z2")),
        Fingerprint("step7000", 7000, "z", ("z1", "z2")),
    ]
    schedule = [(p.step or 0, p.name) for p in prints]
    found = check(prints, schedule)
    assert found.duplicate_of == {"step2000": "step1000", "step3000": "step1000"}
    assert found.shared_shards_with == {"step6000": ["step7000"], "step7000": ["step6000"]}
    assert found.stride == 1000 and found.missing_before == {"step6000": 2}
    assert found.values("step6000") == {
        "import/shared_shards_with": "step7000",
        "import/missing_before": 2,
    }
    # Log-spaced early steps (Pythia's 0, 1, 2, 4, ..., 512, then every 1000) are no gap.
    logs = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    pythia = [*logs, *range(1000, 5000, 1000), *range(6000, 20000, 1000)]
    found = check([], [(s, f"step{s}") for s in pythia])
    assert found.stride == 1000 and found.missing_before == {"step6000": 1}
    assert check([], [(s, f"step{s}") for s in logs]).missing_before == {}  # no schedule


def test_the_table_writes_tokens_as_the_names_do() -> None:
    rows = [
        ("stage1-step11931-tokens50B", 11931, 50 * 10**9, "a" * 64),
        ("stage1-step12000-tokens50.3B", 12000, 50_300_000_000, "b" * 64),
        ("main", None, None, "a" * 64),
    ]
    found = check([Fingerprint(r[0], r[1], r[3], (r[3],)) for r in rows], [])
    assert table(rows, found, {"main"}).splitlines() == [
        "revision                      step   tokens  sha256        flags",
        "stage1-step11931-tokens50B    11931  50B     aaaaaaaaaaaa  ok (imported before)",
        "stage1-step12000-tokens50.3B  12000  50.3B   bbbbbbbbbbbb  ok (imported before)",
        "main                          -      -       aaaaaaaaaaaa  DUPLICATE of stage1-step11931-tokens50B",
    ]


# ----------------------------------------------------------------------- import
def _restored(root: Path, node: Node) -> dict[str, np.ndarray]:
    """The parameters restored at `node`, flattened to `{"blocks_0/attn/c_attn/kernel": array}`."""
    import jax

    with quick(root) as q:
        q.build(HFSuite, "look")
        q.find().node(node).resume()
        job = q.create()
        flat = jax.tree_util.tree_flatten_with_path(job.state.params)[0]
        return {"/".join(k.key for k in p): np.asarray(v) for p, v in flat}


def test_a_suite_becomes_one_lineage_ordered_by_step_and_flagged(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    stepped = {k: v for k, v in revisions.items() if k != "main"}
    cache = suites.hf_cache(tmp_path / "models--org--tiny", stepped, aliases={"main": "step4000"})
    root = tmp_path / "root"
    first = import_suite(cache, root, "tiny", "step0,step2000")
    assert not first.findings.duplicate_of
    later = import_suite(cache, root, "tiny", "all")
    assert later.lineage == first.lineage and later.kept == ["step0", "step2000"]
    assert [n.seq for n in later.nodes] == [1000, 4000]  # only the missing ones
    assert later.nodes[0].parent == Node(*first.lineage.split("~"), 0)
    lines = later.table.splitlines()
    assert lines[0].split() == ["revision", "step", "tokens", "sha256", "flags"]
    assert [line.split()[0] for line in lines[1:]] == ["step0", "step1000", "step2000", "step4000"]
    assert lines[3].endswith("DUPLICATE of step1000")
    assert lines[4].endswith("GAP: 1 step(s) of 1000 missing before")
    main = import_suite(cache, root, "tiny", "main")
    assert [n.seq for n in main.nodes] == [4001]  # after the last step
    assert main.findings.duplicate_of["main"] == "step4000"
    name, nonce = first.lineage.split("~")
    with Store(root / "store") as store:
        nodes = sorted(store.query().name(name).all())
        assert [n.seq for n in nodes] == [0, 1000, 2000, 4000, 4001]  # one lineage, no seq 0 extra
        assert {n.nonce for n in nodes} == {nonce}
        values = {n.seq: store.values(n) for n in nodes}
        steps = {n.seq: [c.step for c in store.checkpoints(n)] for n in nodes}
    assert steps == {0: [0], 1000: [1000], 2000: [2000], 4000: [4000], 4001: [4001]}
    # The later of two identical revisions holds the earlier one's name, even when the
    # earlier one came in a later import.
    assert values[2000]["import/duplicate_of"] == "step1000"
    assert "import/duplicate_of" not in values[1000]
    assert values[4000]["import/missing_before"] == 1
    assert values[4001]["import/duplicate_of"] == "step4000"
    assert values[4001]["import/revision"] == "main" and "import/step" not in values[4001]
    assert values[1000]["import/step"] == 1000 and values[1000]["import/revision"] == "step1000"
    digest = fingerprint("x", 0, [revisions["step1000"] / "model.safetensors"]).sha256
    assert values[1000]["import/sha256"] == values[2000]["import/sha256"] == digest
    assert values[1000]["import/commit"] == hashlib.sha1(b"step1000").hexdigest()
    for seq, revision in ((0, "step0"), (1000, "step1000"), (4000, "step4000")):
        restored = _restored(root, Node(name, nonce, seq))
        expected = folders.theseus_params(revisions[revision])
        assert restored.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(restored[key], expected[key])
    again = import_suite(cache, root, "tiny", "all")
    assert again.nodes == [] and "DUPLICATE of step1000" in again.table
    with Store(root / "store") as store:
        report = store.fsck()
    assert report.clean and not report.unregistered_checkpoints, report.problems


def test_a_middle_revision_imported_later_updates_the_flags_it_changes(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("step0", "step1000", "step2000", "step4000"):
        (src / name).symlink_to(revisions[name])
    root = tmp_path / "root"
    import_suite(src, root, "tiny", "step0,step2000,step4000")
    with Store(root / "store") as store:
        before = {n.seq: (store.values(n), store.checkpoints(n)) for n in store.query().all()}
    import_suite(src, root, "tiny", "step1000")
    with Store(root / "store") as store:
        nodes = {n.seq: n for n in store.query().all()}
        values = {seq: store.values(n) for seq, n in nodes.items()}
        parents = {seq: [p.seq for p in store.parents(n)] for seq, n in nodes.items()}
        line = [n.seq for n in store.ancestors(nodes[4000])]
        held = {seq: store.checkpoints(nodes[seq]) for seq in before}
    assert values[2000]["import/duplicate_of"] == "step1000"  # flagged only once step1000 came
    # step1000 takes its place in the chain: one line, no fork at step0
    assert parents == {0: [], 1000: [0], 2000: [1000], 4000: [2000]}
    assert line == [2000, 1000, 0]
    for seq, (old_values, old_checkpoints) in before.items():
        assert held[seq] == old_checkpoints
        assert {k: v for k, v in values[seq].items() if k != "import/duplicate_of"} == {
            k: v for k, v in old_values.items() if k != "import/duplicate_of"
        }


def test_a_revision_holding_another_revisions_shard_is_flagged(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    for name, seed in (("step0", 0), ("step1000", 1), ("step2000", 2)):
        folder = folders.write_gpt2_folder(src / name, n_layer=1, n_embd=16, n_head=2, seed=seed)
        suites.reshard(folder, 2)
    suites.copy_shard(src / "step2000", src / "step1000", "model-00001-of-00002.safetensors")
    result = import_suite(src, tmp_path / "root", "tiny")
    assert result.findings.shared_shards_with == {
        "step1000": ["step2000"],
        "step2000": ["step1000"],
    }
    assert not result.findings.duplicate_of
    with Store(tmp_path / "root" / "store") as store:
        values = {n.seq: store.values(n) for n in store.query().all()}
    assert values[1000]["import/shared_shards_with"] == "step2000"
    assert "import/shared_shards_with" not in values[0]


def test_refusals_write_nothing(revisions: dict[str, Path], tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "step0").symlink_to(revisions["step0"])
    folders.write_gpt2_folder(src / "step1000", n_layer=2, n_embd=16, n_head=2)
    root = tmp_path / "root"
    with pytest.raises(RevisionError, match=r"step1000 has architecture/n_layers = 2 and step0 1"):
        import_suite(src, root, "tiny")
    assert not root.exists()
    import_suite(src, root, "tiny", "step0")
    other = tmp_path / "other"
    other.mkdir()
    (other / "step5").symlink_to(src / "step1000")
    with pytest.raises(
        RevisionError,
        match=r"^revision step5 does not fit the lineage: architecture/n_layers is 1, but the "
        r"weights in .* need 2; a suite is one model: import it under another --run$",
    ):
        import_suite(other, root, "tiny")
    with Store(root / "store") as store:
        assert [n.seq for n in store.query().all()] == [0]


def test_revisions_added_later_keep_the_lineages_layout(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    from theseus.config import load

    src = tmp_path / "src"
    src.mkdir()
    for name in ("step0", "step1000"):
        (src / name).symlink_to(revisions[name])
    root = tmp_path / "root"
    fsdp = {"training/strategy": "fsdp"}
    first = import_suite(src, root, "tiny", "step1000", overrides=fsdp)
    later = import_suite(src, root, "tiny", "step0")  # no override: the lineage's layout
    with Store(root / "store") as store:
        # step0, imported after step1000, heads the lineage
        assert store.parents(first.nodes[0]) == [later.nodes[0]]
        assert store.parents(later.nodes[0]) == []
        for node in (*first.nodes, *later.nodes):
            saved = load(store.job_config(node) or "")
            assert saved["training"]["strategy"] == "fsdp", node
            assert saved["job"] == "hf/suite"


def test_the_command_imports_a_suite_and_prints_the_table(
    revisions: dict[str, Path], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("step0", "step1000", "step2000"):
        (src / name).symlink_to(revisions[name])
    root = tmp_path / "root b"  # a space: the printed commands quote it
    runner = CliRunner()
    # as `uv run theseus import` starts it: the printed commands start with `uv run`
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "UV_RUN_RECURSION_DEPTH": "1"}
    result = subprocess.run(  # a process of its own: its log lines reach stderr as a user's do
        [sys.executable, "-c", "from theseus.cli import main; main()", "import", "hf", str(src),
         str(root), "--run", "tiny", "--revisions", "all"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "step2000  2000  -       " in result.stdout and "DUPLICATE of step1000" in result.stdout
    # the flag is said once on stderr (it was printed twice: the log and the command's echo)
    assert result.stderr.count("DUPLICATE of step1000") == 1, result.stderr
    assert "Warning: suite general.default.tiny, revision step2000: DUPLICATE of step1000." in (
        result.stderr
    )
    (lineage,) = re.findall(r"nodes of (general\.default\.tiny~[0-9a-f]{8}) ", result.stdout)
    with_analysis = importlib.util.find_spec("theseus.analysis") is not None
    expected = (
        [
            "Analyze:   uv run theseus configure demo/intervene/head-ablation ablation.yaml "
            "--import theseus.analysis.demo",
            f"           uv run theseus run ablation ablation.yaml {shlex.quote(str(root))} "
            f"--over {shlex.quote(lineage)} --import theseus.analysis.demo",
        ]
        if with_analysis  # (theseus-core installed alone: no analysis to suggest)
        else ["Analyze:   install theseus-analysis, whose analyses run --over the lineage."]
    ) + [
        f"Lineage:   uv run theseus-store lineage {shlex.quote(str(root / 'store'))} {lineage}",
        f"Browse:    uv run theseus-store ui {shlex.quote(str(root))}",
    ]
    lines = result.stdout.splitlines()
    start = lines.index(expected[0])
    assert lines[start : start + len(expected)] == expected
    bad = runner.invoke(
        main, ["import", "hf", str(src), str(root), "--run", "tiny", "--revisions", "step9"]
    )
    assert bad.exit_code != 0
    assert "revision 'step9' is not in the suite; it has step0, step1000, step2000" in bad.output
    # a later command, in a fresh interpreter, knows the suite's job without --import
    sampled = subprocess.run(
        [sys.executable, "-c", "from theseus.cli import main; main()", "sample", str(root),
         "tiny", "a", "--temperature", "0", "--max-new-tokens", "2"],
        capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert "~2000 (step 2000):" in sampled.stderr  # the revision's step, not the optimizer's 0
