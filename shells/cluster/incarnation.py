"""Which incarnation of a stream name a node's local copy belongs to (issue 23: a node that was away while
a name was deleted and made again must not keep its old copy under the new placement).

A name deleted on the cluster and made again is another stream. Its placement key ``streams/<name>`` is
created anew in etcd, so the key's **creation revision** (etcd's ``create_revision``, unchanged by every
compare-and-swap that later changes the placement: elections, members) names one incarnation. Each local
copy made from a placement records, in the engine's ``meta`` database under ``cluster-incarnation/<name>``,
the local stream's id, that revision and the cluster's id. The stream id makes a record that outlived
its copy (a crash between a deletion and the record's removal) mean nothing: a copy made later has another
id. The cluster id (a random number the first node put under ``<prefix>id``) ties revisions to one etcd's
data: should etcd lose its data and start afresh, its revisions mean other things and every record of the
old one counts as none (the copies are placed again from the nodes, as before records existed, rather
than dropped as orphans).

On every reconcile (ClusterNode._refresh):

* a copy whose record names another revision than the placement's is of an older incarnation: it is
  dropped (its chunks could pass the leader's truncate-on-HELLO check when they hold the same bytes, and
  its consumer offsets and publisher sequences would leak into the new stream) and copied anew;
* a copy with no record (made here by a client and placed since, or by a version without records) takes
  the placement's revision;
* a copy that no placement and no tombstone names, but that has a record, was placed on the cluster
  once and deleted there while this node was away, its tombstone collected since (deletion.py,
  ``--tombstone-max-age``): an **orphan**, dropped. A copy without a record (made before the node joined a
  cluster or while etcd was away) is placed, led by this node, as before.

Loop thread, except the staged writes, which run on the engine's writer thread.
"""

import logging
import secrets
import struct

from riverbed.engine.errors import RiverbedError, StreamNotFound

log = logging.getLogger("riverbed.cluster")

KEY_PREFIX = b"cluster-incarnation/"
_RECORD = struct.Struct(">QQQ")     # local stream id, etcd creation revision of the placement, cluster id


def _key(name):
    return KEY_PREFIX + name.encode()


async def cluster_id(node):
    """The id of the cluster's etcd data: made by the first node that asks (create-if-absent), then read.
    Raises EtcdError."""
    key = node.prefix + "id"
    await node.etcd.create(key, str(secrets.randbits(63) + 1))
    kv = await node.etcd.get(key)
    try:
        return int(kv.value)
    except (AttributeError, ValueError):
        return 0


def recorded(node, name):
    """The placement creation revision recorded for the local copy of ``name`` now, or None (no copy, no
    record, a record of an earlier copy of that name or of another etcd's data)."""
    engine = node.engine
    try:
        sid = engine._current(name).sid
    except StreamNotFound:
        return None
    raw = engine.get_value(engine._db_meta, _key(name))
    if raw is None or len(raw) != _RECORD.size:
        return None
    rec_sid, revision, cluster = _RECORD.unpack(raw)
    return revision if rec_sid == sid and cluster == node.cluster_id and cluster else None


def record(node, name, revision):
    """Record ``revision`` for the local copy of ``name`` (staged in the next group commit; a copy gone
    meanwhile records nothing). Errors are logged: a missing record only means the copy is adopted by the
    placement it finds next time."""
    cluster = node.cluster_id
    if not revision or not cluster:
        return

    def stage(ctx):
        if ctx.has_stream(name):
            sid = ctx._staged.stream(name).sid
            ctx.txn.put(_key(name), _RECORD.pack(sid, int(revision), cluster), db=ctx.engine._db_meta)
            ctx._staged.dirty = True
    node.broker.transact(stage, lambda res, exc: exc is not None and log.warning(
        "cluster: cannot record the incarnation of %s: %s", name, exc))


def forget(node, name):
    """Remove the record of ``name`` unless a copy of that name is there again (a deletion hook)."""
    node.__dict__.get("_incarnation_seen", {}).pop(name, None)
    def stage(ctx):
        if not ctx.has_stream(name) and ctx.txn.delete(_key(name), db=ctx.engine._db_meta):
            ctx._staged.dirty = True
    try:
        node.broker.transact(stage, lambda res, exc: None)
    except RiverbedError:
        pass


def check(node, name, revision):
    """Called for a placement this node holds a copy for (member, learner or observer): True when the
    copy may serve it; False when it is of an older incarnation and is being dropped (copied anew once
    gone). A copy without a record takes ``revision``."""
    if name in node._member_deleting:
        return False
    try:
        sid = node.engine._current(name).sid
    except StreamNotFound:
        return True
    seen = node.__dict__.setdefault("_incarnation_seen", {})    # name -> (sid, revision) checked already
    if revision and seen.get(name) == (sid, revision):
        return True             # every reconcile, for every copy: no LMDB read once checked
    have = recorded(node, name)
    if have is None:
        record(node, name, revision)
        have = revision
    if not revision or have == revision:
        if revision:
            seen[name] = (sid, revision)
        return True
    seen.pop(name, None)
    log.warning("cluster: %s holds a copy of %s from an earlier stream of that name (placement revision %d, "
                "now %d): dropped, then copied anew", node.name, name, have, revision)
    drop(node, name)
    return False


def orphan(node, name):
    """Whether the local copy of ``name``, which no placement and no tombstone names, was placed on the
    cluster once (it has a record): then the cluster deleted it and this copy must go."""
    return recorded(node, name) is not None


def drop(node, name):
    """Delete the local copy of ``name`` only (the cluster's stream, if any, is another one), then
    reconcile again so that a placement naming this node copies it anew."""
    if name in node._member_deleting:
        return
    f = node.following.pop(name, None)
    if f is not None:
        f[2].cancel()
    node._step_down(name)
    node.detached.pop(name, None)
    node._member_deleting.add(name)

    def deleted(exc):
        if exc is not None:
            node._member_deleting.discard(name)
        node.kick()
    node.broker.delete_stream(name, deleted, copy_only=True)
