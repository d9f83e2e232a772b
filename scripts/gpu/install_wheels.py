"""Install the carried wheels into a target folder, offline, and check every requirement against what results.

    python scripts/gpu/install_wheels.py --site /tmp/site --wheels .gpu/whl --project .

- every wheel in --wheels is installed (pip --no-index --no-deps --target): packages the machine lacks, or needs
  newer (transformers);
- a wheel in --wheels/opt is a fallback for a package the machine already has at a version not known in advance:
  it is installed only when the machine's own version (run this script WITHOUT PYTHONPATH) misses a requirement
  of the installed wheels or of the project, or the machine lacks it entirely while something requires it;
- at the end every requirement of the installed wheels and of the project is checked against the effective
  version (target folder first, then the machine's) and each problem is printed.
Exit code 0 even with problems (the run goes on and reports); 1 only when pip itself fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import time
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


# not carried: debugger, s3:// log storage, W&B (steer_hydra imports it lazily; the kit runs with no logger)
NOT_CARRIED = {"debugpy", "s3fs", "aiobotocore", "wandb"}


def wheel_name_version(path: Path) -> tuple[str, str]:
    parts = path.name.split("-")
    return canonicalize_name(parts[0]), parts[1]


def pip_install(site: Path, wheels: list[Path]) -> int:
    if not wheels:
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(site)]
    return subprocess.call(cmd + [str(w) for w in wheels])


def versions(paths: list[str] | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in md.distributions(path=paths) if paths is not None else md.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def requirements(site: Path, project: Path | None) -> list[tuple[str, Requirement]]:
    """(who, requirement) for every unconditional requirement of the installed wheels and of the project."""
    out: list[tuple[str, Requirement]] = []
    env = {"extra": ""}
    for dist in md.distributions(path=[str(site)]):
        who = canonicalize_name(dist.metadata["Name"] or "?")
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and ("extra" in str(req.marker) or not req.marker.evaluate(env)):
                continue
            out.append((who, req))
    if project is not None and tomllib is not None and (project / "pyproject.toml").exists():
        data = tomllib.loads((project / "pyproject.toml").read_text())
        for raw in data.get("project", {}).get("dependencies", []):
            out.append(("steer-hydra", Requirement(raw)))
    return out


def satisfied(req: Requirement, version: str | None) -> bool:
    if version is None:
        return False
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", required=True)
    parser.add_argument("--wheels", required=True)
    parser.add_argument("--project", default=None)
    args = parser.parse_args()
    site, wheel_dir = Path(args.site), Path(args.wheels)
    project = Path(args.project) if args.project else None
    site.mkdir(parents=True, exist_ok=True)
    base = versions(None)  # this interpreter's own packages (run without PYTHONPATH)
    start = time.perf_counter()

    required = sorted(wheel_dir.glob("*.whl"))
    if pip_install(site, required):
        print("install_wheels: pip failed on the required wheels", flush=True)
        return 1
    print(f"install_wheels: {len(required)} wheels installed in {time.perf_counter() - start:.1f}s", flush=True)

    chosen: list[Path] = []
    for _ in range(5):  # a fallback may bring requirements of its own (python-dateutil 2.x needs six)
        installed = versions([str(site)])
        reqs = requirements(site, project)
        picks: list[Path] = []
        for wheel in sorted((wheel_dir / "opt").glob("*.whl")):
            name, version = wheel_name_version(wheel)
            if name in installed:
                continue
            needs = [(who, r) for who, r in reqs if canonicalize_name(r.name) == name]
            have = base.get(name)
            failing = [(who, r) for who, r in needs if not satisfied(r, have)]
            if not failing:
                continue
            fits = all(satisfied(r, version) for _, r in needs)
            why = "; ".join(f"{who} needs {r}" for who, r in failing)
            print(
                f"install_wheels: fallback {name} {version} (machine has {have or 'none'}: {why})"
                f"{'' if fits else ' -- WARNING: the fallback misses some requirement too'}",
                flush=True,
            )
            picks.append(wheel)
        if not picks:
            break
        if pip_install(site, picks):
            print("install_wheels: pip failed on the fallback wheels", flush=True)
            return 1
        chosen += picks

    installed = versions([str(site)])
    problems = []
    for who, req in requirements(site, project):
        name = canonicalize_name(req.name)
        version = installed.get(name) or base.get(name)
        if not satisfied(req, version):
            note = " (left out on purpose)" if name in NOT_CARRIED and version is None else ""
            problems.append(f"{who} needs {req}: {'absent' if version is None else version}{note}")
    print(
        f"install_wheels: {len(installed)} packages in {site} ({len(chosen)} fallbacks), "
        f"{len(problems)} unmet requirements, {time.perf_counter() - start:.1f}s",
        flush=True,
    )
    for line in sorted(set(problems)):
        print(f"  unmet: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
