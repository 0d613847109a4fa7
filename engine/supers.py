"""Super streams built binding by binding, as RabbitMQ's management API builds them: an exchange is
declared (a super stream with no partitions), then each partition stream is bound to it with a binding
key and a partition order. :class:`SuperStreamBindings` is a part of :class:`riverbed.engine.Engine`;
every method runs in one writer transaction (``Engine.transact``) and returns its Future."""

from riverbed.engine.errors import StreamNotFound
from riverbed.engine.layout import _check_name, normalize_arguments


def _rows(d):
    orders = d.get("orders") or list(range(len(d["partitions"])))
    return list(zip(d["partitions"], d["binding_keys"], orders))


def _with_rows(d, rows):
    return dict(d, partitions=[r[0] for r in rows], binding_keys=[r[1] for r in rows], orders=[r[2] for r in rows])


def with_binding(d, partition, binding_key, order=None):
    """Definition ``d`` (a super stream's dict) with ``partition`` bound under ``binding_key`` at
    ``order`` (None: after the ordered ones): ``(new definition, True)``, or ``(d, False)`` when that
    binding is there already. ``d`` itself is not changed. Pure: the cluster applies the same change to
    etcd's copy of a definition (shells/cluster/superstreams.py)."""
    binding_key = str(binding_key)
    rows = _rows(d)
    if any(p == partition and k == binding_key for p, k, _ in rows):
        return d, False
    rows.append((partition, binding_key, None if order is None else int(order)))
    rows.sort(key=lambda r: (r[2] is None, r[2] or 0))   # stable: ties keep binding order
    return _with_rows(d, rows), True


def without_binding(d, partition, binding_key=None):
    """Definition ``d`` without ``partition``'s binding(s) (only the one with ``binding_key`` when
    given): ``(new definition, number removed)``; ``d`` itself is not changed. Pure, as
    :func:`with_binding`."""
    rows = _rows(d)
    kept = [r for r in rows if not (r[0] == partition and (binding_key is None or r[1] == binding_key))]
    if len(kept) == len(rows):
        return d, 0
    return _with_rows(d, kept), len(rows) - len(kept)


class SuperStreamBindings:
    """Engine methods over the super stream table (``WriteContext.super_stream`` and friends). Thread-safe,
    as every Engine method that submits to the writer."""

    def declare_super_stream(self, name, arguments=None):
        """Record super stream ``name`` with no partitions yet (RabbitMQ's management API declares the
        exchange first and binds the partitions after). Future of True when recorded, False when a
        super stream of that name exists already (left as it is). InvalidArgument for a bad name."""
        _check_name(name, "super stream name")
        arguments = normalize_arguments(arguments)

        def declare(ctx):
            if ctx.super_stream(name) is not None:
                return False
            ctx.put_super_stream(name, {"partitions": [], "binding_keys": [], "arguments": arguments,
                                        "orders": []})
            return True
        return self.transact(declare)

    def bind_super_stream(self, name, partition, binding_key, order=None):
        """Add existing stream ``partition`` to super stream ``name`` with ``binding_key``. Partitions are
        kept by ``order`` (an int; RabbitMQ's ``x-stream-partition-order`` binding argument; those
        without one come after, in binding order). Future of True when added, False when that
        partition was already bound with that key. StreamNotFound when the super stream or the
        partition stream does not exist."""
        _check_name(name, "super stream name")
        _check_name(partition)
        binding_key = str(binding_key)
        order = None if order is None else int(order)

        def bind(ctx):
            d = ctx.super_stream(name)
            if d is None:
                raise StreamNotFound(f"super stream {name!r} does not exist")
            if not ctx.has_stream(partition):
                raise StreamNotFound(f"stream {partition!r} does not exist")
            d, added = with_binding(d, partition, binding_key, order)
            if added:
                ctx.put_super_stream(name, d)
            return added
        return self.transact(bind)

    def unbind_super_stream(self, name, partition, binding_key=None):
        """Remove ``partition``'s binding(s) (only the one with ``binding_key`` when given) from super
        stream ``name``; the stream itself stays. Future of the number removed; StreamNotFound when
        there is no such super stream."""
        def unbind(ctx):
            d = ctx.super_stream(name)
            if d is None:
                raise StreamNotFound(f"super stream {name!r} does not exist")
            d, removed = without_binding(d, partition, binding_key)
            if removed:
                ctx.put_super_stream(name, d)
            return removed
        return self.transact(unbind)

    def forget_super_stream(self, name):
        """Remove super stream ``name``'s definition and keep its partition streams (RabbitMQ's exchange
        deletion). Future of None; StreamNotFound when there is no such super stream."""
        def forget(ctx):
            if ctx.super_stream(name) is None:
                raise StreamNotFound(f"super stream {name!r} does not exist")
            ctx.drop_super_stream(name)
        return self.transact(forget)
