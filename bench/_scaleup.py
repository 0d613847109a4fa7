"""The scale-up row of ``bench.compare`` (issue 26, "one node per core"): two ``riverbed serve`` nodes on
this 2-core machine, joined by a private etcd, against the headline single node.

``scaleup-publish`` runs the server-bound load generator (``bench._loadgen``, pre-encoded Publish frames)
in two client processes, each on a stream of its own. On the single node both streams live in one
process; on ``RiverbedPair`` client i connects to node n(i+1) and creates its stream there with
``initial-cluster-size=1`` and ``queue-leader-locator=client-local``: no replication, each node leads one
partition, the way a super stream with one partition a node spreads over a cluster. Server CPU and RSS
are summed over both nodes. The goal: aggregate publish rate on two nodes >= 1.7x one node's
(``SCALEUP_GOAL``), judged on medians by :func:`scaleup_goal_lines`.
"""

from bench._cluster import RiverbedCluster

SCALEUP_GOAL = 1.7


class RiverbedPair(RiverbedCluster):
    """etcd and two ``riverbed serve`` nodes, one per core; client i speaks to node i % 2 + 1."""

    name = "riverbed-pair"
    label = "Riverbed 2 nodes, one partition each"

    def __init__(self, log=print):
        super().__init__(log=log, n=2)

    def client_port(self, i):
        return self.cluster.nodes[f"n{i % self.n + 1}"].port

    def client_args(self):
        """Every client measures both nodes (the same pids, so their snapshots add up) and makes its
        stream on the node it speaks to, unreplicated."""
        out = ["--stream-arg", "initial-cluster-size=1", "--stream-arg", "queue-leader-locator=client-local"]
        for p in self.pids[1:]:
            out += ["--also-server-pid", str(p)]
        return out


def scaleup_goal_lines(summary):
    """``[{"workload", "pair", "one_node", "ratio", "ok", "text"}]`` for every scale-up row that ran on both."""
    out = []
    for wname in ("scaleup-publish",):
        pair = summary.get((wname, RiverbedPair.name), {}).get("msgs_per_s")
        one = summary.get((wname, "riverbed"), {}).get("msgs_per_s")
        if not pair or not one or not one["med"]:
            continue
        r = pair["med"] / one["med"]
        ok = r >= SCALEUP_GOAL
        out.append({"workload": wname, "pair": pair["med"], "one_node": one["med"], "ratio": r, "ok": ok,
                    "text": f"{wname}: 2 nodes {pair['med']:,.0f} msgs/s, one node {one['med']:,.0f}: {r:.2f}× "
                            f"(goal >= {SCALEUP_GOAL:g}×: {'met' if ok else 'MISSED'})"})
    return out
