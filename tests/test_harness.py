"""The test harness's own promise: the web host a Cluster starts is the process that serves its port.

A port is chosen free and bound moments later; another process that binds it in between would answer the cluster's
requests (with its own databases) while the tests believe they reach the cluster's web host.
"""

import http.server
import threading

import pytest

from testkit.harness import Cluster
from testkit.processes import free_port, listening, service_env

pytestmark = pytest.mark.slow


class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_web_host_whose_port_another_process_answers_on_is_refused(tmp_path):
    # Another server answers /healthz on the port before the cluster's gunicorn can bind it.
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Healthy)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    port = impostor.server_address[1]
    cluster = Cluster(service_env=service_env(), workdir=tmp_path, port=port)
    try:
        with pytest.raises(RuntimeError, match=rf"port {port} of web \(pid \d+\) is held by other processes"):
            cluster.start("web")
    finally:
        cluster.stop()
        impostor.shutdown()
        impostor.server_close()


def test_a_web_host_the_cluster_started_is_what_listens_on_its_port(tmp_path):
    cluster = Cluster(service_env=service_env(), workdir=tmp_path, port=free_port())
    try:
        cluster.start("web")
        assert cluster.procs["web"].pid in listening(cluster.port)
    finally:
        cluster.stop()
