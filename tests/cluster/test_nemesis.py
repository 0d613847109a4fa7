"""The nemesis (issue 23): random faults on etcd and three ``riverbed serve`` nodes under continuous confirmed
publishing (deduplicating publishers that re-send what was not confirmed) and consuming, then a checker.

Faults, chosen at random each step: kill -9 of any node (restarted a moment later), SIGSTOP/SIGCONT of any
node, a graceful restart, a member killed again while it is still catching up after its restart, the leader
killed and then the next leader killed while leadership is still changing, and etcd itself restarted.
After each step every node runs again and every stream must have a live leader within a bound.

The checker: every confirmed message is in the log exactly once, nothing is stored twice, the consumer's
view is a part of the final log at the same offsets, and every member holds the same log in the same order
(read over the protocol, and ``riverbed dump`` of the three data directories, chunk for chunk).

Every kind of fault comes once (in a random order), then random ones until ``RIVERBED_NEMESIS_SECONDS``
(default 30; the README's figures are from 60) have passed; ``RIVERBED_NEMESIS_SEED`` replays a run's choices.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import rawwire
from clusterproc import Cluster
from workload import Consumer, Leaders, Publisher, check, read_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE = 1.0
LEADER_BOUND = 30.0        # seconds within which every stream has a live leader once all nodes run
STREAMS = {"chaos-a": "n1", "chaos-b": "n2"}     # stream -> the node it is created on


def stream_of(st, name):
    return next((s for s in st["streams"] if s["name"] == name), None)


def leader_up(st, name):
    s = stream_of(st, name)
    return s is not None and any(n["up"] and n["name"] == s["leader"] for n in st["nodes"])


class Nemesis:
    def __init__(self, cluster, rng, log, publishers):
        self.c = cluster
        self.rng = rng
        self.log = log
        self.publishers = publishers        # stream -> its Publishers
        self.leader_waits = []
        # every kind of fault once, in a random order, then random ones
        self.plan = [self.kill, self.pause, self.graceful, self.member_catching_up, self.leader_while_changing,
                     self.etcd_restart]
        rng.shuffle(self.plan)

    def leader(self, stream):
        st = self.c.status()
        s = stream_of(st, stream)
        return s["leader"] if s else None

    def settle(self):
        """Every node running; wait (bounded) until every stream has a leader that confirms: each stream's
        publishers get a confirm after this point."""
        for name, srv in self.c.nodes.items():
            if srv.proc.poll() is not None:
                self.c.restart(name)
        t0 = time.monotonic()
        self.c.wait(lambda st: all(leader_up(st, s) for s in STREAMS) and all(n["up"] for n in st["nodes"]),
                    timeout=LEADER_BOUND, what="a live leader for every stream once every node runs")
        while not all(any(p.confirms_after(t0) for p in pubs) for pubs in self.publishers.values()):
            assert time.monotonic() - t0 < LEADER_BOUND, \
                f"a stream confirms nothing {LEADER_BOUND} s after every node runs again (after {self.log[-1]})"
            time.sleep(0.05)
        self.leader_waits.append(time.monotonic() - t0)

    def kill(self):
        name = self.rng.choice(list(self.c.nodes))
        self.log.append(f"kill -9 {name}")
        self.c.nodes[name].kill()
        time.sleep(self.rng.uniform(0.2, 2.0))
        self.c.restart(name)

    def pause(self):
        name = self.rng.choice(list(self.c.nodes))
        secs = self.rng.uniform(0.3, 3.0)
        self.log.append(f"SIGSTOP {name} {secs:.1f}s")
        pid = self.c.nodes[name].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(secs)
        finally:
            os.kill(pid, signal.SIGCONT)

    def graceful(self):
        name = self.rng.choice(list(self.c.nodes))
        self.log.append(f"restart {name}")
        self.c.nodes[name].stop()
        self.c.restart(name)

    def member_catching_up(self):
        """A member down while publishing goes on, restarted, and killed again while it copies the log."""
        stream = self.rng.choice(list(STREAMS))
        lead = self.leader(stream)
        name = self.rng.choice([n for n in self.c.nodes if n != lead])
        self.log.append(f"member {name} of {stream} down, back, killed while catching up")
        self.c.nodes[name].kill()
        time.sleep(self.rng.uniform(1.0, 3.0))
        self.c.restart(name)
        time.sleep(self.rng.uniform(0.0, 0.3))
        self.c.nodes[name].kill()
        time.sleep(0.5)
        self.c.restart(name)

    def leader_while_changing(self):
        """The leader killed; as soon as the placement moves (or a moment later), the next leader too."""
        stream = self.rng.choice(list(STREAMS))
        first = self.leader(stream)
        if not first:
            return
        self.c.nodes[first].kill()
        deadline = time.monotonic() + 5
        second = None
        while time.monotonic() < deadline:
            second = self.leader(stream)
            if second and second != first:
                break
            time.sleep(0.02)
        victim = second if second and second != first else self.rng.choice([n for n in self.c.nodes if n != first])
        self.log.append(f"leader {first} of {stream} killed, then {victim} while leadership changed")
        self.c.nodes[victim].kill()
        time.sleep(self.rng.uniform(0.2, 1.5))
        self.c.restart(first)
        self.c.restart(victim)

    def etcd_restart(self):
        secs = self.rng.uniform(0.5, 3.0)
        self.log.append(f"etcd down {secs:.1f}s")
        self.c.etcd.stop()
        time.sleep(secs)
        self.c.etcd.start()

    def step(self):
        if self.plan:
            fault = self.plan.pop()
        else:
            fault = self.rng.choices([self.kill, self.pause, self.graceful, self.member_catching_up,
                                      self.leader_while_changing, self.etcd_restart], weights=[3, 3, 1, 2, 2, 1])[0]
        fault()
        self.settle()


def dump_lines(data_dir, stream, upto):
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "dump", data_dir, "--stream", stream],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines()
            if line.split() and line.split()[0].isdigit() and int(line.split()[0]) < upto]


def test_nemesis_random_faults_every_confirmed_message_once_one_order(tmp_path, etcd):
    seconds = float(os.environ.get("RIVERBED_NEMESIS_SECONDS", "30"))
    seed = int(os.environ.get("RIVERBED_NEMESIS_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    c = Cluster(tmp_path, etcd, lease_ttl=LEASE, extra=("--replication-timeout", "3"))
    workers = []
    done = []
    try:
        c.start()
        for stream, node in STREAMS.items():
            cl = rawwire.RawClient(c.nodes[node].port)
            assert cl.handshake() == rawwire.OK and cl.create(stream) == rawwire.OK
            cl.close()
        c.wait(lambda st: all(stream_of(st, s) is not None and all(m["committed_offset"] is not None
                                                                  for m in stream_of(st, s)["members"])
                              for s in STREAMS), what="streams placed")
        pubs, cons = {}, {}
        for stream in STREAMS:
            leaders = Leaders(c, stream)
            pubs[stream] = [Publisher(leaders, stream, f"{stream}-p{k}", pace=0.02) for k in (1, 2)]
            cons[stream] = Consumer(leaders, stream)
            workers += [*pubs[stream], cons[stream]]
        for w in workers:
            w.start()
        nemesis = Nemesis(c, rng, done, pubs)
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end or nemesis.plan:
            nemesis.step()
            time.sleep(rng.uniform(0.2, 1.0))
        # the faults stop: every node runs, publishing goes on a little, then the workload stops
        nemesis.settle()
        time.sleep(2)
        for w in workers:
            w.stop()
        c.wait(lambda st: all(all(m["lag"] == 0 for m in stream_of(st, s)["members"]) for s in STREAMS),
               timeout=60, what="every member caught up")
        summaries = {}
        for stream in STREAMS:
            deadline = time.monotonic() + 30
            while True:
                logs = {name: read_log(srv.port, stream) for name, srv in c.nodes.items()}
                if len({len(x) for x in logs.values()}) == 1 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            first = logs["n1"]
            assert all(x == first for x in logs.values()), \
                f"{stream}: the members' logs differ: { {n: len(x) for n, x in logs.items()} }"
            summaries[stream] = check(first, pubs[stream], [cons[stream]])
            assert summaries[stream]["confirmed"] > 0
        for srv in c.nodes.values():
            srv.stop()
        for stream in STREAMS:
            upto = summaries[stream]["log"]
            dumps = {name: dump_lines(c.data_dir(name), stream, upto) for name in c.nodes}
            assert dumps["n1"] and dumps["n1"] == dumps["n2"] == dumps["n3"], f"{stream}: dumps differ"
        print(f"\nnemesis seed {seed}, {len(done)} faults in {seconds:.0f} s: {done}\n"
              f"every stream confirming again within max {max(nemesis.leader_waits):.2f} s of every node "
              f"running; {summaries}")
    except BaseException:
        print(f"nemesis seed {seed}; faults so far: {done}")
        raise
    finally:
        try:
            for w in workers:
                if w.is_alive():
                    w.stop()
        finally:
            c.stop()         # the servers stop even if a worker does not
