"""Pack the pipeline's Python environment for Spark's executors: ``make pipeline-archive``.

Spark ships a Python application's dependencies to its executors as its docs advise for
native packages ("Python Package Management": a packed virtual environment): a
``venv-pack`` archive given to ``spark-submit --archives ARCHIVE#env``, and the
executors' Python pointed into it with ``PYSPARK_PYTHON=./env/bin/python``:

    make pipeline-archive
    PYSPARK_DRIVER_PYTHON=python PYSPARK_PYTHON=./env/bin/python \\
    spark-submit --master spark://HOST:7077 --archives build/txsync-pipeline-env.tar.gz#env \\
        "$(python -m txsync.pipeline.command --path)" audit-order --data /shared/txsync-data

``--py-files`` cannot carry what the jobs run on executors: grpcio (``load``, ``export
--endpoints``), psycopg and pglast (PostgreSQL ``verify-replicas``), uvloop; they are
native. The archive holds txsync (not editable: venv-pack refuses editable installs) with
its ``server`` extra and the pipeline's other packages, built in a virtual environment of
its own. PySpark is left out (about 500 MB): Spark puts its own ``pyspark.zip`` on the
executors' Python path, so the executors run the cluster's PySpark, as they must.

What the archive cannot carry is Python itself: venv-pack packs the environment, and its
``bin/python`` stays a link to the interpreter that made it (here ``python3.11``), which
must exist at the same path on every executor. The example image
(``k8s/spark/Dockerfile``) is built so; a cluster of another Python builds the archive
there, or uses ``conda-pack``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXECUTOR_EXTRAS = "server"
"""txsync's extras the executors need: the client, the txlog reader and the SQL backends
the jobs open there."""


def pipeline_packages() -> list[str]:
    """The ``pipeline`` extra of pyproject.toml without PySpark (the cluster brings its
    own)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra: list[str] = project["optional-dependencies"]["pipeline"]
    return [r for r in extra if not r.replace("_", "-").lower().startswith("pyspark")]


DEFAULT_OUT = ROOT / "build" / "txsync-pipeline-env.tar.gz"


def say(text: str) -> None:
    print(f"pipeline-archive: {text}", file=sys.stderr, flush=True)


VENV_PACK = Path(sys.executable).parent / "venv-pack"
"""venv-pack, installed beside this script's Python (the dev extra)."""


def run(*command: str | Path) -> None:
    subprocess.run([str(part) for part in command], check=True)


def build(out: Path, python: str, work: Path, python_prefix: str | None) -> Path:
    """Build the environment under ``work`` and pack it to ``out``; returns ``out``."""
    environment = work / "pipeline-env"
    if environment.exists():
        shutil.rmtree(environment)  # a fresh environment: nothing left from a past build
    started = time.monotonic()
    say(f"creating {environment} with {python}")
    run(python, "-m", "venv", environment)
    pip = environment / "bin" / "pip"
    packages = pipeline_packages()
    say(f"installing txsync[{EXECUTOR_EXTRAS}] and {', '.join(packages)} (no PySpark)")
    run(pip, "install", "--quiet", "--upgrade", "pip")
    run(pip, "install", "--quiet", f"{ROOT}[{EXECUTOR_EXTRAS}]", *packages)
    # Bytecode now, once: otherwise every executor's Python compiles the imports anew.
    run(environment / "bin" / "python", "-m", "compileall", "-q", "-j", "0", environment / "lib")
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"packing {environment} into {out}")
    relink = ("--python-prefix", python_prefix) if python_prefix else ()
    run(VENV_PACK, "--quiet", "--prefix", environment, "--output", out, "--force", *relink)
    megabytes = out.stat().st_size / 2**20
    say(f"{out} ({megabytes:.0f} MiB) in {time.monotonic() - started:.0f} s; ship it with")
    say(f"  spark-submit --archives {out}#env  and  PYSPARK_PYTHON=./env/bin/python")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="the archive to write (default %(default)s)"
    )
    parser.add_argument(
        "--python",
        default=f"python{sys.version_info.major}.{sys.version_info.minor}",
        help="the interpreter the environment is made with; the executors need the same "
        "one at the same path (default %(default)s)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / "build",
        help="where the environment is built before packing (default %(default)s)",
    )
    parser.add_argument(
        "--python-prefix",
        help="where Python is installed on the executors, when not where it is here (e.g. "
        "/usr/local for python:3.11 images): the packed bin/python links there",
    )
    options = parser.parse_args()
    if shutil.which(options.python) is None:
        parser.error(f"no interpreter {options.python!r} on PATH")
    if not VENV_PACK.exists():
        parser.error(f"no {VENV_PACK}: install the dev extra (pip install -e '.[dev]')")
    try:
        build(options.out.resolve(), options.python, options.work.resolve(), options.python_prefix)
    except subprocess.CalledProcessError as error:
        sys.exit(f"pipeline-archive: {error}")


if __name__ == "__main__":
    main()
