"""The driver JVM's stderr: the incubator-module warning is dropped, every other line reaches the real stderr."""

import subprocess

from analytics.jvm_output import child_stderr_filtered

SCRIPT = """
echo 'before' >&2
echo 'WARNING: Using incubator modules: jdk.incubator.vector' >&2
echo 'WARN SparkContext: a real warning' >&2
printf 'no newline at the end' >&2
"""


def test_a_child_started_inside_loses_only_the_incubator_warning(capfd):
    with child_stderr_filtered() as forwarder:
        child = subprocess.Popen(["sh", "-c", SCRIPT])
    child.wait(timeout=30)
    forwarder.join(timeout=30)

    err = capfd.readouterr().err
    assert "incubator" not in err
    assert err == "before\nWARN SparkContext: a real warning\nno newline at the end"


def test_this_process_writes_to_the_real_stderr_again_after_the_block(capfd):
    with child_stderr_filtered() as forwarder:
        pass
    subprocess.run(["sh", "-c", "echo 'WARNING: Using incubator modules: x' >&2"], check=True)
    forwarder.join(timeout=30)

    assert capfd.readouterr().err == "WARNING: Using incubator modules: x\n"
