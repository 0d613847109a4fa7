"""Child-process side of the document store's SIGKILL test (run as a script with the parent's interpreter).

    python _docs_crash_child.py project DATA_DIR FSYNC     commit projection steps until killed

Step N is deterministic (``step_ops(N)``, seeded by N): a few puts, merges and deletes in collection
"items" (key field "id", unique "email", secondary "bucket") and the counter document of "state",
committed together with position N of reference "proj" on stream "events" in one ``DocStore.apply``.
Every 5th step first tries a write that breaks the unique index, which must be refused and leave nothing.
The child prints "start P" (the stored position it resumes from, 0 at first), then N after each
acknowledged step, flushed at once. ``replay(P)`` is what the store must hold at position P.
"""

import random
import sys

COLLECTIONS = ("items", "state")


def step_ops(n):
    """The DocStore.apply ops of step ``n``."""
    rnd = random.Random(n)
    ops = []
    for _ in range(rnd.randint(1, 5)):
        k = rnd.randrange(60)
        r = rnd.random()
        if r < 0.6:
            ops.append(("put", "items", None, {"id": k, "email": f"e{k}-{n}", "bucket": rnd.randrange(7),
                                               "step": n, "pad": "x" * rnd.randrange(300)}))
        elif r < 0.8:
            ops.append(("merge", "items", k, {"id": k, "touched": n}))
        else:
            ops.append(("delete", "items", k))
    ops.append(("put", "state", "counter", {"id": "counter", "step": n}))
    return ops


def apply_ops(state, ops):
    for op in ops:
        kind, coll = op[0], op[1]
        docs = state.setdefault(coll, {})
        if kind == "put":
            doc = dict(op[3])
            docs[doc["id"]] = doc
        elif kind == "merge":
            doc = dict(docs.get(op[2], {}))
            doc.update(op[3])
            docs[op[2]] = doc
        else:
            docs.pop(op[2], None)


def replay(position):
    """``{collection: [(id, doc)] in id order}`` after steps 1..position."""
    state = {c: {} for c in COLLECTIONS}
    for n in range(1, position + 1):
        apply_ops(state, step_ops(n))
    return {c: sorted(docs.items(), key=lambda kv: (type(kv[0]) is str, kv[0])) for c, docs in state.items()}


def snapshot(ds):
    """What the store holds, in replay()'s shape."""
    return {c: list(ds.scan(c)) for c in COLLECTIONS}


def some_email(state):
    for _, doc in state["items"]:
        if "email" in doc:
            return doc["email"]
    return None


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def fail(msg):
    import os
    sys.stderr.write(f"child error: {msg}\n")
    sys.stderr.flush()
    os._exit(3)


def project(path, fsync):
    from riverbed.engine import DocStore, Engine, UniqueViolation
    eng = Engine(path, fsync=fsync)
    ds = DocStore(eng)
    if not eng.has_stream("events"):
        eng.create_stream("events").result()
    ds.create_collection("items", [("email", True), "bucket"], key_field="id").result()
    ds.create_collection("state", key_field="id").result()
    pos = ds.position("events", "proj") or 0
    state = {c: dict(rows) for c, rows in replay(pos).items()}
    say("start", pos)
    n = pos
    while True:
        n += 1
        if n % 5 == 0:
            email = some_email({"items": list(state["items"].items())})
            if email is not None:
                try:
                    ds.apply([("put", "items", None, {"id": 10 ** 6 + n, "email": "fresh"}),
                              ("put", "items", None, {"id": 2 * 10 ** 6 + n, "email": email})],
                             position=("events", "proj", n)).result()
                    fail(f"step {n}: a duplicate email {email!r} was accepted")
                except UniqueViolation:
                    pass
        ops = step_ops(n)
        ds.apply(ops, position=("events", "proj", n)).result()
        apply_ops(state, ops)
        say(n)


def main(argv):
    if argv[0] == "project":
        project(argv[1], argv[2])
    else:
        fail(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
