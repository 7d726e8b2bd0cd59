"""Registries: @job, @analysis, @dataset, lazy built-ins, --import of modules and files."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from theseus.registry import (
    ANALYSES,
    DATASETS,
    JOBS,
    ImportFailedError,
    Registry,
    RegistryError,
    UnknownNameError,
    analysis,
    dataset,
    import_module_or_file,
    job,
    job_key,
    resolve_job,
)


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Names registered by a test, removed afterwards from every registry."""
    taken: list[str] = []
    yield taken
    for name in taken:
        for registry in (JOBS, ANALYSES, DATASETS):
            registry.unregister(name)


def test_job_registers_under_its_name(names: list[str]) -> None:
    names.append("tests/registry/a")

    @job("tests/registry/a")
    class A:
        """First line.

        More."""

    assert JOBS["tests/registry/a"] is A
    assert "tests/registry/a" in JOBS and "tests/registry/a" in list(JOBS)
    assert "tests/registry/a" not in ANALYSES
    assert job_key(A) == "tests/registry/a"


def test_analysis_registers_an_analysis_and_a_job(names: list[str]) -> None:
    names.append("tests/registry/an")

    @analysis("tests/registry/an")
    class An:
        pass

    assert ANALYSES["tests/registry/an"] is An
    assert JOBS["tests/registry/an"] is An


def test_a_different_class_under_a_taken_name_is_an_error(names: list[str]) -> None:
    names.append("tests/registry/dup")

    @job("tests/registry/dup")
    class First:
        pass

    with pytest.raises(RegistryError) as info:

        @job("tests/registry/dup")
        class Second:
            pass

    message = str(info.value)
    assert "'tests/registry/dup'" in message and "First" in message and "Second" in message
    assert "Choose another name" in message
    assert JOBS["tests/registry/dup"] is First
    with pytest.raises(RegistryError, match="already registered"):
        analysis("tests/registry/dup")(type("Third", (), {}))


def test_bad_names_and_targets_are_errors() -> None:
    with pytest.raises(RegistryError, match="non-empty string"):
        job("")(type("X", (), {}))
    with pytest.raises(RegistryError, match="decorates a class"):
        job("tests/registry/fn")(len)  # type: ignore[type-var]


def test_unknown_name_lists_the_closest_and_how_to_import(names: list[str]) -> None:
    names.append("tests/registry/counter")
    job("tests/registry/counter")(type("C", (), {}))
    with pytest.raises(UnknownNameError) as info:
        JOBS["tests/registry/countr"]
    message = str(info.value)
    assert "No job is registered as 'tests/registry/countr'" in message
    assert "Did you mean 'tests/registry/counter'" in message
    assert "--import" in message
    assert isinstance(info.value, KeyError)


def test_builtins_are_imported_lazily_on_first_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fake_builtin_jobs.py").write_text(
        "from theseus.registry import Registry\n"
        "import sys\n"
        "REG = sys.modules['__registry_under_test__']\n"
        "REG.register('builtin/x', int)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("thing", builtins=("fake_builtin_jobs", "theseus.absent.module"))
    monkeypatch.setitem(sys.modules, "__registry_under_test__", registry)  # type: ignore[arg-type]
    monkeypatch.delitem(sys.modules, "fake_builtin_jobs", raising=False)
    assert "fake_builtin_jobs" not in sys.modules
    registry.register("user/y", str)
    assert registry["user/y"] is str  # already registered: the built-ins stay unimported
    assert "fake_builtin_jobs" not in sys.modules
    assert registry["builtin/x"] is int
    assert "fake_builtin_jobs" in sys.modules
    assert len(registry) == 2


def test_reimporting_a_file_does_not_register_twice(tmp_path: Path, names: list[str]) -> None:
    names.append("tests/registry/file-job")
    source = tmp_path / "my_jobs.py"
    source.write_text(
        "from theseus.registry import job\n"
        "@job('tests/registry/file-job')\n"
        "class FileJob:\n"
        "    '''A job from a file.'''\n"
    )
    module = import_module_or_file(str(source))
    assert import_module_or_file(str(source)) is module
    assert JOBS["tests/registry/file-job"] is module.FileJob
    # Executing the same file again under the same module name (a reload) is fine too.
    del sys.modules[module.__name__]
    again = import_module_or_file(str(source))
    assert again is not module
    assert JOBS["tests/registry/file-job"] is again.FileJob
    del sys.modules[again.__name__]


def test_a_file_is_its_stem_module_so_job_keys_agree(tmp_path: Path, names: list[str]) -> None:
    names.append("tests/registry/stem-job")
    source = tmp_path / "stem_jobs_xyz.py"
    source.write_text(
        "from theseus.registry import job\n"
        "@job('tests/registry/stem-job')\n"
        "class Registered:\n    pass\n"
        "class Loose(Registered):\n    pass\n"
    )
    module = import_module_or_file(str(source))
    assert module.__name__ == "stem_jobs_xyz"
    # the key a YAML file would name the unregistered class by, as from Python
    assert job_key(module.Loose) == "stem_jobs_xyz:Loose"
    assert resolve_job("stem_jobs_xyz:Loose") is module.Loose  # no second import, no clash
    assert JOBS["tests/registry/stem-job"] is module.Registered
    del sys.modules["stem_jobs_xyz"]


def test_import_by_module_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> None:
    names.append("tests/registry/mod-job")
    (tmp_path / "regmodjobs.py").write_text(
        "from theseus.registry import job\n@job('tests/registry/mod-job')\nclass ModJob:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = import_module_or_file("regmodjobs")
    assert JOBS["tests/registry/mod-job"] is module.ModJob
    assert resolve_job("tests/registry/mod-job") is module.ModJob
    assert resolve_job("regmodjobs:ModJob") is module.ModJob
    monkeypatch.delitem(sys.modules, "regmodjobs")


def test_import_errors_say_what_failed(tmp_path: Path) -> None:
    with pytest.raises(ImportFailedError, match="no such file"):
        import_module_or_file(str(tmp_path / "absent.py"))
    with pytest.raises(ImportFailedError, match="'no_such_module_xyz'"):
        import_module_or_file("no_such_module_xyz")
    broken = tmp_path / "broken.py"
    broken.write_text("raise ValueError('boom')\n")
    with pytest.raises(ImportFailedError, match=r"raised ValueError: boom"):
        import_module_or_file(str(broken))
    assert isinstance(ImportFailedError("x"), ImportError)


def test_unregistered_class_key_is_module_and_qualname() -> None:
    class Loose:
        pass

    assert (
        job_key(Loose)
        == f"{__name__}:test_unregistered_class_key_is_module_and_qualname.<locals>.Loose"
    )


def test_dataset_registry_holds_preparable_classes(names: list[str]) -> None:
    names.append("tests/registry/ds")

    @dataset("tests/registry/ds")
    class Tiny:
        @classmethod
        def prepare(cls, root: Path, **options: object) -> None:
            pass

    assert DATASETS["tests/registry/ds"] is Tiny
    assert "tests/registry/ds" not in JOBS


def test_resolve_job_reports_the_real_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user's module that itself fails to import: the error is that failure, not
    # "unknown job" (which is what swallowing the ImportError used to say).
    (tmp_path / "broken_jobs_xyz.py").write_text(
        "import not_installed_pkg_xyz\nclass Job:\n    pass\n"
    )
    (tmp_path / "fine_jobs_xyz.py").write_text("class Job:\n    pass\nvalue = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportFailedError) as caught:
        resolve_job("broken_jobs_xyz:Job")
    message = str(caught.value)
    assert "importing 'broken_jobs_xyz' raised ModuleNotFoundError" in message
    assert "not_installed_pkg_xyz" in message
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)

    with pytest.raises(ImportFailedError, match="there is no module 'no_such_module_xyz'"):
        resolve_job("no_such_module_xyz.sub:Job")
    with pytest.raises(UnknownNameError, match=r"fine_jobs_xyz has no attribute 'Jbo'.*'Job'"):
        resolve_job("fine_jobs_xyz:Jbo")
    with pytest.raises(RegistryError, match="not a class"):
        resolve_job("fine_jobs_xyz:value")
    assert resolve_job("fine_jobs_xyz:Job").__name__ == "Job"
    for name in ("fine_jobs_xyz", "broken_jobs_xyz"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_plugin_modules_load_with_the_builtins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A module named in the registry's entry-point group registers its jobs on the first
    lookup; one whose import fails is one line naming the entry point."""
    from importlib.metadata import EntryPoint

    import theseus.registry as registry

    (tmp_path / "plugin_jobs_for_test.py").write_text(
        "from theseus.registry import job\n"
        "@job('tests/registry/plugged')\n"
        "class Plugged:\n"
        "    '''A job a plug-in registers.'''\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {"g": [EntryPoint("plugged", "plugin_jobs_for_test", "g")]}
    monkeypatch.setattr(registry, "entry_points", lambda group: found.get(group, []))
    plugged = Registry("job", builtins=(), plugins="g")
    try:
        assert len(plugged) == 0  # the first lookup imports the plug-in's module ...
        assert "tests/registry/plugged" in JOBS  # ... whose decorator registers into JOBS
    finally:
        JOBS.unregister("tests/registry/plugged")
        sys.modules.pop("plugin_jobs_for_test", None)
    found["g"] = [EntryPoint("broken", "no_module_named_this_xyz", "g")]
    with pytest.raises(
        ImportFailedError, match=r"'g' entry point 'broken' .* names 'no_module_named_this_xyz'"
    ):
        len(Registry("job", builtins=(), plugins="g"))


def test_resolve_job_refuses_what_is_neither_a_name_nor_a_class() -> None:
    for wrong in (42, None, ["gpt/train/pretrain"]):
        with pytest.raises(RegistryError, match=r"^expected a job: a registered name \(a str"):
            resolve_job(wrong)  # type: ignore[arg-type]
