"""scripts/system-deps.sh: installs the Debian packages the tests need as root with apt-get, otherwise
stops with one line naming them. Run against a fake file tree (SYSDEPS_ROOT) with fake `id` and
`apt-get` first on PATH, so nothing on this machine is installed or removed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "system-deps.sh"
BASH = "/bin/bash"

BINARIES = {
    "chromium": "usr/bin/chromium",
    "redis-server": "usr/bin/redis-server",
    "postgresql": "usr/lib/postgresql/15/bin/initdb",
    "docker-compose": "usr/bin/docker-compose",
    "caddy": "usr/bin/caddy",
}
ALL = tuple(BINARIES)


def _exe(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


class Fake:
    def __init__(self, tmp: Path, uid: int, apt: bool = True, apt_installs: bool = True) -> None:
        self.root = tmp / "root"
        self.root.mkdir()
        self.bin = tmp / "bin"
        self.log = tmp / "apt.log"
        _exe(self.bin / "id", f'[ "$1" = -u ] && echo {uid} || exit 3\n')
        if apt:
            # Logs each call; `install` creates the packages' binaries in the fake tree.
            creates = (
                "".join(
                    f'    {pkg}) mkdir -p "$(dirname "{self.root}/{rel}")"; '
                    f'printf "#!/bin/sh\\n" > "{self.root}/{rel}"; chmod +x "{self.root}/{rel}";;\n'
                    for pkg, rel in BINARIES.items()
                )
                if apt_installs
                else ""
            )
            _exe(
                self.bin / "apt-get",
                f'echo "$*" >> "{self.log}"\n'
                'if [ "$1" = install ]; then for p in "$@"; do case "$p" in\n' + creates + "  esac; done; fi\n",
            )

    def have(self, *packages: str) -> None:
        for pkg in packages:
            _exe(self.root / BINARIES[pkg], "")

    def run(self, *args: str, system_path: bool = True) -> subprocess.CompletedProcess[str]:
        path = str(self.bin) + (os.pathsep + "/usr/bin:/bin" if system_path else "")
        env = {"PATH": path, "SYSDEPS_ROOT": str(self.root)}
        return subprocess.run([BASH, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)

    def apt_calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def test_everything_present_does_nothing(tmp_path: Path) -> None:
    fake = Fake(tmp_path, uid=0)
    fake.have(*ALL)
    out = fake.run()
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert fake.apt_calls() == []


def test_dry_run_with_everything_present_says_so(tmp_path: Path) -> None:
    fake = Fake(tmp_path, uid=1000)  # no root needed to be told nothing is missing
    fake.have(*ALL)
    out = fake.run("--dry-run")
    assert (out.returncode, out.stdout, out.stderr) == (
        0,
        "all present: chromium redis-server postgresql docker-compose caddy\n",
        "",
    )
    assert fake.apt_calls() == []


def test_root_with_apt_updates_once_and_installs_only_what_is_missing(tmp_path: Path) -> None:
    fake = Fake(tmp_path, uid=0)
    fake.have("redis-server")
    out = fake.run()
    assert out.returncode == 0, out.stderr
    assert fake.apt_calls() == ["update -qq", "install -y -qq chromium postgresql docker-compose caddy"]
    assert out.stderr == "installing Debian packages the tests need: chromium postgresql docker-compose caddy\n"
    assert fake.run().returncode == 0 and len(fake.apt_calls()) == 2  # second run: nothing left to do


def test_not_root_stops_with_one_line_naming_the_packages(tmp_path: Path) -> None:
    fake = Fake(tmp_path, uid=1000)
    fake.have("chromium")
    out = fake.run()
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr == (
        "error: the tests need Debian packages that are missing: run "
        "`sudo apt-get install -y redis-server postgresql docker-compose caddy` "
        "(or as root: make test)\n"
    )
    assert fake.apt_calls() == []


def test_root_without_apt_get_stops_with_one_line(tmp_path: Path) -> None:
    fake = Fake(tmp_path, uid=0, apt=False)
    out = fake.run(system_path=False)  # PATH holds only the fake `id`: no apt-get anywhere
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "chromium redis-server postgresql" in out.stderr


def test_dry_run_says_what_it_would_run_and_runs_nothing(tmp_path: Path) -> None:
    fake = Fake(tmp_path, uid=0)
    out = fake.run("--dry-run")
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        "would run: apt-get update -qq",
        "would run: apt-get install -y -qq chromium redis-server postgresql docker-compose caddy",
    ]
    assert fake.apt_calls() == []


def test_install_that_leaves_a_binary_missing_fails(tmp_path: Path) -> None:
    fake = Fake(tmp_path, uid=0, apt_installs=False)
    out = fake.run()
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        "error: apt-get install finished but these are still missing: chromium redis-server postgresql "
        "docker-compose caddy"
    )


def test_unknown_argument_is_refused(tmp_path: Path) -> None:
    out = Fake(tmp_path, uid=0).run("--force")
    assert (out.returncode, out.stderr) == (2, "system-deps.sh: unknown argument --force (use --dry-run)\n")


_OUTER_MAKE = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def _make_dry(target: str) -> str:
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        # A `make test PYTEST_ARGS=…` that runs this test passes its variables down in MAKEFLAGS: drop them.
        env={**{k: v for k, v in os.environ.items() if k not in _OUTER_MAKE}, "PYTEST_ARGS": ""},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_test_installs_system_packages_and_prints_skip_reasons_but_serve_does_not() -> None:
    test_cmds = _make_dry("test").splitlines()
    assert "scripts/system-deps.sh" in test_cmds
    assert test_cmds[-1].split()[-3:] == ["pytest", "-q", "-rs"]
    assert "system-deps" not in _make_dry("serve")


def test_ci_only_calls_make_test() -> None:
    lines = [
        line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert lines == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make test"]


def test_missing_binary_fails_as_root_with_apt_and_skips_otherwise(missing_system_binary, monkeypatch) -> None:
    import shutil

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    with pytest.raises(pytest.fail.Exception, match="redis-server not found.*system-deps.sh should have installed"):
        missing_system_binary("redis-server", "redis-server")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="install the Debian package redis-server"):
        missing_system_binary("redis-server", "redis-server")
