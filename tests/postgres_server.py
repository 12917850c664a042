"""A PostgreSQL server for tests, started as an operator would on Debian: the package's
initdb and postgres binaries, as the ``postgres`` user, on a free port of 127.0.0.1."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infergate.stack.processes import free_ports

SUPERUSER = "postgres"


def _bindir() -> Path | None:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return versions[-1].parent if versions else None


def unavailable() -> str | None:
    """Why no server can be started here, or None."""
    if _bindir() is None:
        return "PostgreSQL is not installed (Debian package postgresql)"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "starting PostgreSQL as its own user needs root and runuser"
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        return "no 'postgres' user (the Debian package creates it)"
    return None


@dataclass(frozen=True)
class Postgres:
    port: int
    password: str  # of the superuser

    def sql(self, statement: str, database: str = "postgres") -> str:
        run = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-d", database,
             "-tAc", statement],
            env={**os.environ, "PGPASSWORD": self.password},
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return run.stdout.strip()

    def create_database(self, name: str, owner: str, password: str) -> str:
        """A database and its owner; the URI to reach it (the password left out)."""
        self.sql(f"CREATE USER {owner} PASSWORD '{password}'")
        self.sql(f"CREATE DATABASE {name} OWNER {owner}")
        return f"postgresql://{owner}@127.0.0.1:{self.port}/{name}"


@contextmanager
def running_postgres(password: str = "postgres-test") -> Iterator[Postgres]:
    bindir = _bindir()
    assert bindir is not None, unavailable()
    root = Path(tempfile.mkdtemp(prefix="infergate-pg-"))  # pytest's folders are root's
    data, secret = root / "data", root / "password"
    data.mkdir()
    secret.write_text(password)
    for path in (root, data, secret):
        shutil.chown(path, SUPERUSER)
    as_postgres = ["runuser", "-u", SUPERUSER, "--"]
    subprocess.run(
        [*as_postgres, str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER,
         "--auth=scram-sha-256", f"--pwfile={secret}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    [port] = free_ports(1)
    with (root / "postgres.log").open("wb") as log:
        server = subprocess.Popen(
            [*as_postgres, str(bindir / "postgres"), "-D", str(data), "-p", str(port),
             "-k", str(root), "-c", "listen_addresses=127.0.0.1"],
            stdout=log, stderr=log,
        )  # fmt: skip
    try:
        postgres = Postgres(port, password)
        deadline = time.monotonic() + 60
        while subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", str(port)],
                             capture_output=True).returncode != 0:  # fmt: skip
            assert server.poll() is None and time.monotonic() < deadline, (
                root / "postgres.log"
            ).read_text()
            time.sleep(0.2)
        yield postgres
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)
