"""The pipeline on Spark clusters as data engineers ship jobs (issue 54): ``spark-submit``
with the application's file, on ``local-cluster`` (executors in JVMs and Python workers of
their own) and on a standalone master with a worker; every job with the executors' Python
taken from ``make pipeline-archive``'s packed environment (``--archives ...#env``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from tests.pipeline.conftest import DCS, ROWS, TXS, DevRun
from tests.support.processes import free_port, transaction_store
from tests.support.waiting import wait_until
from txsync.pipeline.uris import joined

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
SUBMIT_TIMEOUT_S = 600
"""A spark-submit run, executors' JVMs included: generous for a loaded machine."""
ARCHIVE_TIMEOUT_S = 1800
"""Building the packed environment: a virtual environment and pip installing into it."""
SPARK_BIN = Path(pyspark.__file__).parent / "bin"
SPARK_ENVIRONMENT = {**os.environ, "PYSPARK_PYTHON": sys.executable,
                     "PYSPARK_DRIVER_PYTHON": sys.executable}  # fmt: skip
LOCAL_CLUSTER = "local-cluster[2,1,1024]"
"""Two executors, each a JVM of its own with its own Python workers."""
ONE_EXECUTOR_CLUSTER = "local-cluster[1,1,1024]"
"""One executor: enough to run a job's executor code from the packed environment, which
each executor unpacks for itself (450 MB); with two, the seven submissions of that test
took 585 s of a CI run."""
SPARK_WORK = SPARK_BIN.parent / "work"
"""Where ``local-cluster``'s workers keep each application's files, the packed environment
unpacked per executor among them (450 MB each). Spark never removes them, and no flag
moves them for ``local-cluster``: a CI run left 5.3 GB there (8 applications), more than
a third of what the whole run wrote, on a CI machine whose disk then filled
(``spark_work_removed``)."""


@pytest.fixture(autouse=True)
def spark_work_removed() -> Iterator[None]:
    """Each test removes the applications' directories its jobs made under SPARK_WORK."""
    before = set(SPARK_WORK.iterdir()) if SPARK_WORK.is_dir() else set()
    yield
    if SPARK_WORK.is_dir():
        for made in set(SPARK_WORK.iterdir()) - before:
            shutil.rmtree(made, ignore_errors=True)


def _spark_submit(
    master: str,
    *job: str,
    spark_options: tuple[str, ...] = (),
    environment: Mapping[str, str] = SPARK_ENVIRONMENT,
) -> subprocess.CompletedProcess[str]:
    """``spark-submit --master MASTER [SPARK_OPTIONS] <the pipeline's file> JOB...``"""
    application = subprocess.run(
        [sys.executable, "-m", "txsync.pipeline.command", "--path"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    return subprocess.run(
        [str(SPARK_BIN / "spark-submit"), "--master", master, *spark_options, application, *job],
        capture_output=True, text=True, check=False, timeout=SUBMIT_TIMEOUT_S,
        env=dict(environment),
    )  # fmt: skip


def test_spark_submit_runs_a_job_on_its_master_with_executors_of_their_own(
    dev_cluster: DevRun,
) -> None:
    """As data engineers ship jobs: ``spark-submit --master ... <this file> JOB``. The
    session takes spark-submit's master (a master set in code would win and run the job
    in the driver alone): here ``local-cluster``. A ``--master`` given to the job still
    wins."""
    audit = ("audit-order", "--data", str(dev_cluster.data))
    # spark-submit passes the driver's stdout and stderr on as its stdout. (A JSON
    # answer, nothing else in it, on the same master: the packed environment's test.)
    said = _spark_submit(LOCAL_CLUSTER, *audit)
    assert said.returncode == 0, said.stderr[-3000:]
    assert f"(Spark master: {LOCAL_CLUSTER})" in said.stdout, said.stdout
    assert "every DC agrees" in said.stdout, said.stdout
    overridden = _spark_submit(LOCAL_CLUSTER, *audit, "--master", "local[1]")
    assert overridden.returncode == 0, overridden.stderr[-3000:]
    assert "(Spark master: local[1])" in overridden.stdout, overridden.stdout


def test_a_job_runs_on_a_standalone_master_and_worker(dev_cluster: DevRun, tmp_path: Path) -> None:
    """A standalone Spark cluster, as a data team runs one: a master and a worker, each
    its own JVM (pip's pyspark lacks sbin/start-master.sh, so they are started as that
    script starts them, through bin/spark-class), and the job submitted to it."""
    port, worker_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = [(tmp_path / f"{name}.log").open("w") for name in ("master", "worker")]
    daemons = [subprocess.Popen(
        [str(SPARK_BIN / "spark-class"), "org.apache.spark.deploy.master.Master",
         "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())],
        stdout=logs[0], stderr=subprocess.STDOUT, env=SPARK_ENVIRONMENT,
    )]  # fmt: skip
    try:
        wait_until("the master listens", lambda: _listening(port), SUBMIT_TIMEOUT_S)
        daemons.append(subprocess.Popen(
            [str(SPARK_BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker", url,
             "--host", "127.0.0.1", "--port", str(worker_port), "--cores", "2",
             "--memory", "1g", "--webui-port", str(free_port()),
             "--work-dir", str(tmp_path / "work")],
            stdout=logs[1], stderr=subprocess.STDOUT, env=SPARK_ENVIRONMENT,
        ))  # fmt: skip
        ran = _spark_submit(url, "audit-order", "--data", str(dev_cluster.data))
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
        assert f"(Spark master: {url})" in ran.stdout, ran.stdout[-3000:]
        assert "every DC agrees" in ran.stdout, ran.stdout[-3000:]
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
            daemon.wait(timeout=60)
        for log in logs:
            log.close()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_archive_script_without_venv_pack_says_what_to_install(tmp_path: Path) -> None:
    """Run by an interpreter with no venv-pack beside it (a bare directory holding only a
    link to Python): a usage error naming the missing tool, not a traceback."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
    ran = subprocess.run(
        [str(bare / "python3"), str(ROOT / "scripts" / "pipeline_archive.py"),
         "--out", str(tmp_path / "env.tar.gz"), "--work", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 2, ran.stderr
    assert f"no {bare / 'venv-pack'}: install the dev extra" in ran.stderr
    assert "Traceback" not in ran.stderr and not (tmp_path / "pipeline-env").exists()


@pytest.fixture(scope="module")
def packed_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make pipeline-archive``'s script, run as that target runs it, into a directory of
    the test's own."""
    work = tmp_path_factory.mktemp("pipeline-archive")
    archive = work / "txsync-pipeline-env.tar.gz"
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "pipeline_archive.py"),
         "--out", str(archive), "--work", str(work)],
        capture_output=True, text=True, check=False, timeout=ARCHIVE_TIMEOUT_S,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return archive


@pytest.mark.network  # pip installs the environment from PyPI
def test_every_job_runs_with_executors_in_the_packed_environment(
    dev_cluster: DevRun,
    packed_environment: Path,
    postgres_replica: str,
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    """As Spark's docs ship native dependencies: ``--archives ARCHIVE#env`` and the
    executors' Python at ``./env/bin/python``, on ``local-cluster``. The archive holds no
    PySpark (the cluster's is used) and the executors see nothing of the test's virtual
    environment, so each job below that passes ran its executor code from the archive:
    one job per kind of dependency an executor imports (the txlog reader for ``export``,
    psycopg for the PostgreSQL replica, grpcio for ``load``); the other jobs import
    nothing more (``audit-order`` reads Parquet, ``report`` plots in the driver, ``export
    --endpoints`` reads as ``load`` writes) and run on ``local-cluster`` in
    ``test_spark_submit_runs_a_job_on_its_master_with_executors_of_their_own`` or on
    ``local[*]`` in the pipeline's other tests. What ``export`` wrote is read back in the
    tests' own session: a fifth submission (an ``audit-order`` of the lake, one more
    driver and executor unpacking the archive) cost about 70 s of CI for nothing the
    others do not show. Without the archive the same submission fails: nothing else
    provides ``./env/bin/python``."""
    from_archive = {**SPARK_ENVIRONMENT, "PYSPARK_PYTHON": "./env/bin/python"}

    def submit(*job: str, archive: bool = True) -> subprocess.CompletedProcess[str]:
        options = ("--archives", f"{packed_environment}#env") if archive else ()
        return _spark_submit(
            ONE_EXECUTOR_CLUSTER, *job, spark_options=options, environment=from_archive
        )

    data, lake = str(dev_cluster.data), (tmp_path / "lake").as_uri()
    without = submit("audit-order", "--data", data, archive=False)
    assert without.returncode != 0, "the executors ran a Python the archive did not bring"

    exported = submit("export", "--data", data, "--out", lake)
    assert exported.returncode == 0, exported.stdout[-3000:] + exported.stderr[-3000:]
    synced = spark.read.parquet(joined(lake, "synced")).orderBy("position").collect()
    orders = {dc: [row.tx_id for row in synced if row.dc == dc] for dc in DCS}
    assert orders == dict.fromkeys(DCS, dev_cluster.order)
    sqlite_replica = dev_cluster.data / "dc2" / "dc2-w1" / "worker.sqlite"
    verified = submit(
        "verify-replicas", f"--replica=sqlite={sqlite_replica}",
        f"--replica=pg={postgres_replica}", "-o", "json",
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    assert json.loads(verified.stdout)["equal"]

    store = transaction_store(tmp_path / "dc1", "dc1")
    store.start()
    try:
        csv = tmp_path / "rows.csv"
        csv.write_text("id,name\n" + "".join(f"{n},name {n}\n" for n in range(ROWS)))
        loaded = submit(
            "load", "--endpoints", f"dc1={store.address}", "--input", csv.as_uri(),
            "--columns", "id,name", "--sql", "INSERT INTO t (id, name) VALUES (?, ?)",
            "--rows-per-transaction", "1",
        )  # fmt: skip
        assert loaded.returncode == 0, loaded.stdout[-3000:] + loaded.stderr[-3000:]
        assert f"{ROWS} transactions created" in loaded.stdout, loaded.stdout[-3000:]
    finally:
        store.terminate()


SPARK_IMAGE = "txsync-spark:dev"
IMAGE_TIMEOUT_S = 1800
"""Building the Spark image: wheels (PySpark's is about 400 MB), Java from Debian."""


@pytest.fixture(scope="module")
def spark_image() -> str:
    """``make spark-image``: k8s/spark/Dockerfile built as the service image is."""
    subprocess.run(
        [str(ROOT / "scripts" / "build_image.sh"), SPARK_IMAGE],
        env={**os.environ, "DOCKERFILE": "k8s/spark/Dockerfile", "EXTRAS": "server,pipeline"},
        check=True, cwd=ROOT, timeout=IMAGE_TIMEOUT_S,
    )  # fmt: skip
    return SPARK_IMAGE


def _docker_run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "run", "--rm", *arguments],
        capture_output=True, text=True, check=False, timeout=SUBMIT_TIMEOUT_S,
    )  # fmt: skip


@pytest.mark.docker
def test_the_spark_image_runs_a_job_as_a_driver_and_starts_an_executor(
    dev_cluster: DevRun, spark_image: str, tmp_path: Path
) -> None:
    """The image's entrypoint as Spark on Kubernetes calls it. ``driver`` as the driver
    pod's arguments are (``--properties-file`` aside), with a local master where the
    operator's would be ``k8s://``: the job runs in the image's one Python, as its user.
    ``executor`` as an executor pod starts: its settings from the environment, the JVM
    options in order (a value with ``=`` kept whole), Spark's Kubernetes executor backend
    started, which then fails to reach a driver that is not there."""
    data = tmp_path / "data"
    shutil.copytree(dev_cluster.data, data, ignore=shutil.ignore_patterns("*.sqlite*"))
    for path in (data, *data.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the image's user (uid 185) reads it
    driver = _docker_run(
        "-v", f"{data}:/data:ro", spark_image,
        "driver", "--master", "local[2]", "local:///opt/txsync/pipeline.py",
        "audit-order", *(f"--dc={dc}=/data/{dc}" for dc in DCS), "-o", "json",
    )  # fmt: skip
    assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:]
    report = json.loads(driver.stdout)
    assert report["agrees"] and report["lengths"] == dict.fromkeys(DCS, TXS)

    settings = {
        "SPARK_EXECUTOR_MEMORY": "512m", "SPARK_EXECUTOR_ID": "1", "SPARK_EXECUTOR_CORES": "1",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:9",
        "SPARK_APPLICATION_ID": "spark-test", "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_JAVA_OPT_1": "-Dtxsync.probe=a=b", "SPARK_JAVA_OPT_0": "-XshowSettings:properties",
    }  # fmt: skip
    environment = [f"--env={name}={value}" for name, value in settings.items()]
    executor = _docker_run(*environment, spark_image, "executor")
    said = executor.stdout + executor.stderr
    assert executor.returncode != 0, said[-3000:]
    assert "txsync.probe = a=b" in said, said[-3000:]
    # The backend's own log (not the command line, which the properties above echo).
    assert "KubernetesExecutorBackend: Started daemon" in said, said[-3000:]
    assert "Failed to connect to /127.0.0.1:9" in said, said[-3000:]
    missing = _docker_run(spark_image, "executor")
    assert missing.returncode != 0 and "SPARK_EXECUTOR_MEMORY: set by Spark" in missing.stderr
