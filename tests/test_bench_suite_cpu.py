"""bench/suite_cpu.py: a command's CPU charged to the kinds of process that spent it."""

import sys

from bench import suite_cpu

# Burns CPU, then lives on past a sampling interval so its last burst is sampled.
BURN = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.6: pass'); time.sleep(1.5)"


def test_a_childs_cpu_is_charged_to_its_kind_and_the_host_busy_time_covers_it():
    code, result = suite_cpu.measure([sys.executable, "-c", BURN])

    assert code == 0
    assert result["per_kind"]["other python"] >= 0.5
    assert result["host_busy_cpu_seconds"] >= result["per_kind"]["other python"]
    assert result["wall_seconds"] >= 2.0
    # Charged to no named kind, its command line is listed.
    assert any(line.startswith(sys.executable) for line in result["top_unnamed"])


def test_kinds_tell_the_machines_services_from_those_the_command_started():
    assert suite_cpu.kind_of("mariadbd", "/usr/sbin/mariadbd", shared=True) == "mariadb (shared)"
    galera = "/usr/sbin/mariadbd --defaults-file=/tmp/creditshop-galera-x/gal1/my.cnf"
    assert suite_cpu.kind_of("mariadbd", galera, shared=False) == "mariadb (started by the command)"
    assert suite_cpu.kind_of("java", "java -cp pyspark/jars/* org.apache.spark.deploy.SparkSubmit", shared=False) == (
        "spark jvm"
    )
    celery = "/work/main/.venv/bin/python3 /work/main/.venv/bin/celery -A config worker"
    assert suite_cpu.kind_of("celery", celery, shared=False) == "celery"
    assert suite_cpu.kind_of("python3", "python3 -m pytest -n 4", shared=False) == "pytest"
