"""Pack Theseus for a TPU host that has no network; run it on a machine that has one.

    uv run python tools/tpu/pack.py [--out .whl-tpu]

writes OUT (default `.whl-tpu/` at the repository's root, git-ignored):

- the four Theseus wheels (`uv build --all-packages --wheel`);
- a wheel of every other package they need at run time, at `uv.lock`'s version for the
  host (Python 3.11 on x86_64 Linux): the lock's closure of theseus-core[gpt2] and
  theseus-analysis[inspect,eval], what the accelerator set needs beyond the host's
  pytest and the benchmarks need (`TESTS`), nox and what the default suite needs with
  everything they need (`TOOLS`), less what the host has (`HOST`: its JAX, with jaxlib, libtpu,
  numpy, scipy, ml-dtypes, opt-einsum), what its own package index gives (`INDEX`) and
  what only those need (pip brings it from the index with them). A package published
  only as source is built into a wheel here (it must be pure Python);
- `requirements-host.txt`: the `INDEX` packages, each with the range the workspace's
  pyproject files declare for it (the lock's version beside it, as a comment), which
  `tools/tpu/install.sh` takes from the host's index. A host's index holds a version or
  two of each, seldom the lock's (a TPU v5e host's: orbax-checkpoint 0.12.4 where the lock
  has 0.12.8, pandas 3.0.6 for 3.1.1, ...), and pip picks there what fits its JAX;
- `packed.json`: the Python, platform and lock this was packed for.

`--index-has NAME,...` replaces `INDEX` (what the host's index is known to give) and
`--python`/`--platform` the target. Needs uv and pip (this interpreter's or `uvx pip`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What the TPU host has installed with its JAX; never packed, never installed.
HOST = ("jax", "jaxlib", "libtpu", "numpy", "scipy", "ml-dtypes", "opt-einsum")
#: What the host's own package index gives (compiled, large): taken from there.
INDEX = ("flax", "optax", "orbax-checkpoint", "tensorstore", "pandas", "pyarrow", "pyyaml",
         "matplotlib", "safetensors", "tokenizers", "scikit-learn")  # fmt: skip
#: The accelerator set's test dependencies the host's python3 may lack (it has pytest),
#: and what benchmarks/ imports beyond the runtime closure (recorder.py: equinox).
TESTS = ("pytest-timeout", "equinox", "jaxtyping", "wadler-lindig")
#: Packed with everything they need (`uv.lock`'s closure) but the host's pytest: nox, for
#: `nox -s tpu` there, and what the default suite needs that a host's python3 may lack.
TOOLS = ("nox", "pytest-xdist", "hypothesis", "filelock")
#: The runtime closure: these packages of the workspace with these extras.
EXTRAS = ("gpt2", "inspect", "eval")
EXPORT = ("--package", "theseus-core", "--package", "theseus-analysis",
          *(arg for extra in EXTRAS for arg in ("--extra", extra)))  # fmt: skip


class PackError(RuntimeError):
    """Something the pack cannot do (the message says what and how to fix it)."""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def target_environment(python: str, machine: str = "x86_64") -> dict[str, str]:
    """PEP 508 marker values of the host: CPython `python` on Linux `machine`."""
    return {
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "platform_machine": machine,
        "sys_platform": "linux",
        "os_name": "posix",
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_version": f"{python}.0",
    }


def pins(exported: str, environment: dict[str, str]) -> dict[str, str]:
    """`uv export`'s requirements that apply to `environment`: name -> version.

    Each line is `name==version` with an optional ` ; marker`.
    """
    from packaging.markers import Marker

    found: dict[str, str] = {}
    for line in exported.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, _, marker = line.partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate(environment):
            continue
        name, _, version = requirement.strip().partition("==")
        if not version:
            raise PackError(f"uv export gave {line!r}; expected name==version")
        found[normalize(name)] = version.strip()
    return found


def split(closure: dict[str, str], index: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """`(packed, from_index)`: the closure less `HOST`, apart by whether `index` gives it."""
    host = {normalize(n) for n in HOST}
    indexed = {normalize(n) for n in index}
    packed = {n: v for n, v in closure.items() if n not in host and n not in indexed}
    from_index = {n: v for n, v in closure.items() if n in indexed}
    return packed, from_index


def declared(pyprojects: Sequence[Path], extras: Sequence[str]) -> dict[str, str]:
    """What the workspace's pyproject files require of each package: name -> range.

    The dependencies of each, and those of its optional extras named in `extras`; a
    package required twice keeps both ranges (`>=0.4,>=0.4.1`). Other packages of the
    workspace (`theseus-*`) are left out.
    """
    from packaging.requirements import Requirement

    ranges: dict[str, list[str]] = {}
    for path in pyprojects:
        project = tomllib.loads(path.read_text())["project"]
        lines = list(project.get("dependencies", []))
        for extra in extras:
            lines += project.get("optional-dependencies", {}).get(extra, [])
        for line in lines:
            requirement = Requirement(line)
            name = normalize(requirement.name)
            if not name.startswith("theseus-") and str(requirement.specifier):
                ranges.setdefault(name, []).append(str(requirement.specifier))
    return {name: ",".join(sorted(set(found))) for name, found in ranges.items()}


def host_requirements(from_index: dict[str, str], ranges: dict[str, str]) -> str:
    """requirements-host.txt: each package with its declared range, the lock's version
    as a comment."""
    lines = [
        "# What tools/tpu/install.sh takes from the TPU host's own package index: the\n",
        "# workspace's declared ranges, pip picks the index's versions (uv.lock's beside).\n",
    ]
    for name, version in sorted(from_index.items()):
        lines.append(f"{name}{ranges.get(name, '')}  # uv.lock: {version}\n")
    return "".join(lines)


def closure(lock: dict, roots: Sequence[str], environment: dict[str, str]) -> set[str]:
    """`roots` and every package they need by `uv.lock` in `environment` (PEP 503 names):
    each dependency whose marker holds there, with the extras it names."""
    from packaging.markers import Marker

    entries: dict[str, list[dict]] = {}
    for package in lock["package"]:
        entries.setdefault(normalize(package["name"]), []).append(package)

    def holds(dependency: dict) -> bool:
        marker = dependency.get("marker")
        return not marker or Marker(marker).evaluate(environment)

    found: set[str] = set()
    todo = [(normalize(r), ()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if name in found and not extras:
            continue
        found.add(name)
        for package in entries.get(name, []):
            needs = list(package.get("dependencies", []))
            for extra in extras:
                needs += package.get("optional-dependencies", {}).get(extra, [])
            todo += [(normalize(d["name"]), tuple(d.get("extra", ()))) for d in needs if holds(d)]
    return found


def source_only(lock: dict, names: set[str]) -> set[str]:
    """Which of `names` `uv.lock` knows no wheel of (published as source only)."""
    return {
        normalize(p["name"])
        for p in lock["package"]
        if normalize(p["name"]) in names and not p.get("wheels")
    }


def _run(command: Sequence[str], **kwargs: object) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]
    if done.returncode:
        raise PackError(
            f"{' '.join(command[:4])} ... failed ({done.returncode}): "
            + (done.stderr.strip().splitlines() or ["no output"])[-1]
        )
    return str(done.stdout)


def _pip() -> list[str]:
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    if shutil.which("uvx"):
        return ["uvx", "pip"]
    raise PackError("no pip: install pip into this interpreter, or uv (for `uvx pip`)")


def export(*extra: str) -> str:
    """`uv export` of the lock, without the workspace's own packages."""
    return _run(["uv", "export", "--frozen", "--no-hashes", "--no-emit-workspace",
                 "--no-annotate", "--no-header", *extra])  # fmt: skip


def pack(out: Path, python: str, platforms: Sequence[str], index: Sequence[str]) -> dict:
    """Write `out` (emptied first); returns what `packed.json` holds."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    environment = target_environment(python)
    runtime = pins(export("--no-dev", *EXPORT), environment)
    # Without what only the host's packages and the index's need (pip brings those from
    # the index with them): matplotlib's pillow, flax's msgpack, ...
    pruned = [arg for name in (*HOST, *index) for arg in ("--prune", name)]
    needed = pins(export("--no-dev", *EXPORT, *pruned), environment)
    tests = pins(export("--only-dev"), environment)
    missing = [n for n in TESTS if normalize(n) not in tests]
    if missing:
        raise PackError(f"uv.lock's dev group has no {', '.join(missing)}; add it to pyproject")
    needed.update({normalize(n): tests[normalize(n)] for n in TESTS})
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    tools = closure(lock, TOOLS, environment) - {"pytest"}
    unpinned = sorted(n for n in tools if n not in tests)
    if unpinned:
        raise PackError(f"uv.lock's dev group has no {', '.join(unpinned)} for the host")
    needed.update({n: tests[n] for n in tools})
    packed, _ = split(needed, index)
    _, from_index = split(runtime, index)

    print(f"building the Theseus wheels into {out}", flush=True)
    _run(["uv", "build", "--all-packages", "--wheel", "--out-dir", str(out)])
    for stray in out.iterdir():  # uv build writes a .gitignore beside the wheels
        if stray.suffix != ".whl":
            stray.unlink()

    built = source_only(lock, set(packed))
    pip = _pip()
    wanted = out / "packed-requirements.txt"
    wanted.write_text("".join(f"{n}=={v}\n" for n, v in sorted(packed.items()) if n not in built))
    tags = [f"--platform={p}" for p in platforms]
    abi = f"cp{python.replace('.', '')}"
    print(f"downloading {len(packed) - len(built)} wheels for Python {python}", flush=True)
    _run([*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(out),
          f"--python-version={python}", "--implementation=cp", f"--abi={abi}", "--abi=abi3",
          "--abi=none", *tags, "-r", str(wanted)])  # fmt: skip
    wanted.unlink()
    for name in sorted(built):
        print(f"building {name}=={packed[name]} from its source", flush=True)
        _run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
              f"{name}=={packed[name]}"])  # fmt: skip
    impure = [w.name for w in out.glob("*.whl") if normalize(w.name.split("-")[0]) in built
              and not w.name.endswith("-none-any.whl")]  # fmt: skip
    if impure:
        raise PackError(f"{', '.join(impure)} built for this machine only; the host needs its own")

    ranges = declared(sorted(ROOT.glob("packages/*/pyproject.toml")), EXTRAS)
    (out / "requirements-host.txt").write_text(host_requirements(from_index, ranges))
    digest = hashlib.sha256((ROOT / "uv.lock").read_bytes()).hexdigest()[:16]
    record = {
        "python": python,
        "platforms": list(platforms),
        "uv.lock": digest,
        "host": list(HOST),
        "index": sorted(from_index),
        "wheels": sorted(w.name for w in out.glob("*.whl")),
    }
    (out / "packed.json").write_text(json.dumps(record, indent=2) + "\n")
    size = sum(w.stat().st_size for w in out.glob("*.whl")) / 2**20
    print(f"{out}: {len(record['wheels'])} wheels ({size:.1f} MiB); "
          f"{len(from_index)} packages from the host's index (requirements-host.txt)")  # fmt: skip
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".whl-tpu", help="the folder to write")
    parser.add_argument("--python", default="3.11", help="the host's Python (major.minor)")
    parser.add_argument(
        "--platform",
        action="append",
        help="a wheel platform tag of the host (repeatable; default manylinux x86_64)",
    )
    parser.add_argument(
        "--index-has",
        help="comma-separated packages the host's index gives (default: " + ",".join(INDEX) + ")",
    )
    args = parser.parse_args(argv)
    platforms = args.platform or [f"manylinux_2_{m}_x86_64" for m in (17, 27, 28)] + [
        "manylinux2014_x86_64"
    ]
    index = args.index_has.split(",") if args.index_has else list(INDEX)
    try:
        pack(args.out.resolve(), args.python, platforms, index)
    except PackError as error:
        print(f"pack.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
