"""The real npm ``rabbitmq-stream-js-client@0.6.2`` against ``riverbed serve`` with RabbitMQ's management API on
its HTTP listener (issue 19), nothing in between: each test runs one scenario of js/rmq_js_scenarios.js.

* management-API fixtures as the client's own suite builds them (a stream with ``PUT /api/queues``, a super
  stream with an exchange, partition queues and bindings, ``messages`` read back, everything deleted);
* the server's version (PeerProperties ``version``) lets the client create and delete super streams and
  filter (below 3.13.0 it refuses both);
* its connections closed through ``DELETE /api/connections/{name}`` while it consumes and publishes: it
  notices, restarts and carries on, with no exception (a server Close request is "Unknown response 22" to it).

ci/npm-rmq-js-deps.sh installs the client into ~/.cache/riverbed-test once; the tests skip without node/npm.
"""

import json
import os
import shutil
import subprocess

import pytest

from procs import ServerProcess

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "rmq_js_scenarios.js")


@pytest.fixture(scope="module")
def rmq_js_modules():
    """node_modules with rabbitmq-stream-js-client@0.6.2 (ci/npm-rmq-js-deps.sh); skips without node/npm."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm not installed")
    out = subprocess.run([os.path.join(ROOT, "ci", "npm-rmq-js-deps.sh")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("rmq-js") / "data", "--http-port", "0").start()
    yield s
    assert s.stop() == 0, s.log()


def js(node_modules, srv, scenario, stream, timeout=60, **cfg):
    cfg.update(scenario=scenario, port=srv.port, httpPort=srv.ports["http"], stream=stream,
               totalTimeoutMs=int(timeout * 1000))
    env = dict(os.environ, NODE_PATH=node_modules)
    out = subprocess.run(["node", SCRIPT, json.dumps(cfg)], capture_output=True, text=True, env=env,
                         timeout=timeout + 30)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" not in result, (result, srv.log()[-3000:])
    assert result["uncaught"] == [], result["uncaught"]
    return result


def test_management_api_fixtures_as_the_client_suite_builds_them(rmq_js_modules, srv):
    r = js(rmq_js_modules, srv, "mgmt_fixtures", "jsfx", n=50)
    steps = r["steps"]
    assert steps["createStream"] == 201 and steps["createStreamAgain"] == 204
    assert steps["superStream"] == {"exchange": 201, "queues": [201] * 3, "bindings": [201] * 3}
    assert r["publish"] == {"sent": 50, "confirmed": True}
    q = r["queueInfo"]
    assert q["messages"] == 50 and q["type"] == "stream" and q["arguments"]["x-queue-type"] == "stream"
    assert q["node"] and q["leader"] == q["node"] and q["members"] == [q["node"]]
    # the exchange and its bindings are a super stream for the client: Partitions in binding order, Route by key
    assert r["partitions"] == ["jsfx-super-0", "jsfx-super-1", "jsfx-super-2"]
    assert r["routes"] == {"0": ["jsfx-super-0"], "1": ["jsfx-super-1"], "2": ["jsfx-super-2"], "nope": []}
    assert r["superConsumed"] == 30 and r["partitionMessages"] == [10, 10, 10]
    assert steps["deleteSuperStream"] == {"exchange": 204, "queues": [204] * 3}
    assert steps["deleteStream"] == 204 and steps["getDeleted"] == 404 and steps["getDeletedExchange"] == 404


def test_server_version_enables_super_streams_and_filtering(rmq_js_modules, srv):
    r = js(rmq_js_modules, srv, "super_streams_and_filtering", "jsv")
    assert r["serverVersion"] == "4.3.0"
    assert r["created"] is True and r["partitions"] == ["jsv-ss-0", "jsv-ss-1", "jsv-ss-2"]
    # the client's CreateSuperStream shows through the management API as RabbitMQ shows it
    assert r["exchange"] == 200 and r["bindings"] == [["jsv-ss-0", "0"], ["jsv-ss-1", "1"], ["jsv-ss-2", "2"]]
    assert r["deleted"] is True and r["partitionsAfterDelete"] == 404
    assert r["filtered"] == [f"A-{i}" for i in range(20)] * 2


def test_connection_closed_through_the_api_while_the_client_runs(rmq_js_modules, srv):
    r = js(rmq_js_modules, srv, "closed_by_api", "jsclosed", timeout=60)
    assert r["listed"] >= 2 and r["deleteStatus"] == 204
    assert r["noticed"] and r["closedAfterDelete"] == [False] * r["listed"]   # closed, not an error
    assert r["relisted"] == r["listed"]                                         # restarted
    assert r["before"] == {"sent": 10, "confirmed": True} and r["after"] == {"sent": 10, "confirmed": True}
    assert "after-9" in r["got"]
