"""A Spark standalone cluster on 127.0.0.1: one master and N workers, started with the
``spark-class`` script of the pyspark wheel (no separate Spark download). ``lockstep dev up
--spark-workers 2`` runs it; ``lockstep run PIPELINE --master spark://127.0.0.1:7077`` runs a
pipeline's jobs on it.

Example::

    cluster = LocalSparkCluster(Path(".lockstep/spark"), port=7077, workers=2)
    cluster.up()           # the master, then each worker; returns once all workers registered
    cluster.master_url     # 'spark://127.0.0.1:7077'
    cluster.down()
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from coordinator.settings import Settings
from lockstep.dev.service import HOST, LocalService, ServiceError, free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DEFAULT_PORT = 7077


class SparkClusterError(ServiceError):
    """The local Spark cluster could not be started or stopped; the message says why."""


def spark_home() -> Path:
    """The pyspark wheel's folder: it carries Spark's jars and ``bin/spark-class``."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkClusterError("pyspark is not installed in this Python; run scripts/setup")
    return Path(spec.origin).parent


class _SparkDaemon(LocalService):
    """A master or worker: ``spark-class MAIN --properties-file HOME/spark.properties ...``."""

    error = SparkClusterError

    def __init__(self, home: Path, port: int, web_port: int) -> None:
        super().__init__(home, port)
        self.web_port = web_port

    @property
    def properties_file(self) -> Path:
        return self.home / "spark.properties"

    @property
    def marker(self) -> str:
        return str(self.properties_file)

    def prepare(self) -> None:
        (self.home / "work").mkdir(parents=True, exist_ok=True)
        # the master's REST submission server would take port 6066, the coordinator's default,
        # for a way of submitting that Lockstep does not use
        self.properties_file.write_text("spark.ui.showConsoleProgress false\nspark.master.rest.enabled false\n")

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def command(self) -> list[str]:
        home = spark_home()
        return [str(home / "bin" / "spark-class"), self.main_class, "--properties-file", str(self.properties_file),
                *self.arguments()]

    def launch(self) -> int:
        # spark-class reads these; SPARK_HOME makes it find the wheel's jars
        os.environ.setdefault("SPARK_HOME", str(spark_home()))
        os.environ.setdefault("SPARK_LOCAL_IP", HOST)
        return super().launch()


class SparkMaster(_SparkDaemon):
    name = "spark-master"
    main_class = MASTER_CLASS
    port_setting = "LOCKSTEP_SPARK_MASTER=spark://127.0.0.1:<port>"

    def arguments(self) -> list[str]:
        return ["--host", HOST, "--port", str(self.port), "--webui-port", str(self.web_port)]

    def workers_alive(self) -> int:
        """How many workers the master has registered as ALIVE (its JSON status page)."""
        with urllib.request.urlopen(f"http://{HOST}:{self.web_port}/json/", timeout=2) as answer:
            status = json.loads(answer.read())
        return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")

    def answers(self) -> bool:
        try:
            self.workers_alive()
        except (OSError, ValueError) as exc:  # ValueError: a page not yet its JSON one, while the UI starts
            self.last_error = str(exc)
            return False
        return True


class SparkWorker(_SparkDaemon):
    name = "spark-worker"
    main_class = WORKER_CLASS

    def __init__(self, home: Path, port: int, web_port: int, master: SparkMaster, cores: int, memory: str) -> None:
        super().__init__(home, port, web_port)
        self.master, self.cores, self.memory = master, cores, memory

    def arguments(self) -> list[str]:
        return ["--host", HOST, "--port", str(self.port), "--webui-port", str(self.web_port), "--cores", str(self.cores),
                "--memory", self.memory, "--work-dir", str(self.home / "work"), f"spark://{HOST}:{self.master.port}"]

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.web_port}/json/", timeout=2) as answer:
                return bool(json.loads(answer.read()).get("masterurl"))
        except OSError as exc:
            self.last_error = str(exc)
            return False


class LocalSparkCluster:
    """A master and ``workers`` workers under ``home`` (``master/``, ``worker-N/``), each
    worker with ``cores`` cores and ``memory`` for executors."""

    def __init__(self, home: Path, port: int = DEFAULT_PORT, workers: int = 2, cores: int = 1,
                 memory: str = "1g") -> None:
        self.home = Path(home).absolute()
        self.port, self.workers, self.cores, self.memory = port, workers, cores, memory

    @classmethod
    def for_settings(cls, settings: Settings, workers: int | None = None) -> LocalSparkCluster | None:
        """The cluster ``lockstep dev`` manages: ``$LOCKSTEP_HOME/spark``, its master on the port of
        a ``spark://127.0.0.1:PORT`` LOCKSTEP_SPARK_MASTER (else 7077). With ``workers`` None, the
        cluster started there before, if any."""
        home = settings.home / "spark"
        url = urlparse(settings.spark_master)
        port = url.port if url.scheme == "spark" and url.hostname in (HOST, "localhost") and url.port else DEFAULT_PORT
        if workers is None:
            layout = home / "ports.json"
            if not layout.exists():
                return None
            workers = sum(1 for key in json.loads(layout.read_text()) if key.startswith("worker-") and key.count("-") == 1)
        return cls(home, port, workers)

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def _ports(self) -> dict[str, int]:
        """Web UI and worker ports, chosen once and kept in ``home/ports.json``."""
        file = self.home / "ports.json"
        ports: dict[str, int] = json.loads(file.read_text()) if file.exists() else {}
        wanted = ["master-ui", *(f"worker-{n}{part}" for n in range(1, self.workers + 1) for part in ("", "-ui"))]
        if any(key not in ports for key in wanted):
            taken = {self.port, *ports.values()}
            for key in wanted:
                if key not in ports:
                    ports[key] = free_port(exclude=frozenset(taken))
                    taken.add(ports[key])
            self.home.mkdir(parents=True, exist_ok=True)
            file.write_text(json.dumps(ports))
        return ports

    @property
    def master(self) -> SparkMaster:
        return SparkMaster(self.home / "master", self.port, self._ports()["master-ui"])

    def worker(self, n: int) -> SparkWorker:
        ports = self._ports()
        return SparkWorker(self.home / f"worker-{n}", ports[f"worker-{n}"], ports[f"worker-{n}-ui"], self.master,
                           self.cores, self.memory)

    def up(self, timeout: float = 120.0) -> int:
        """Start the master and the workers that are not running; returns once the master
        counts every worker ALIVE (the number of them)."""
        master = self.master
        master.start(timeout)
        for n in range(1, self.workers + 1):
            self.worker(n).start(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if master.workers_alive() >= self.workers:
                return self.workers
            time.sleep(0.5)
        raise SparkClusterError(f"the Spark master at {self.master_url} did not register {self.workers} workers "
                                f"within {timeout:.0f}s.\n{master.log_tail()}")

    def down(self) -> bool:
        """Stop the workers, then the master; True if any was running."""
        stopped = [self.worker(n).down() for n in range(self.workers, 0, -1)]
        return self.master.down() or any(stopped)
