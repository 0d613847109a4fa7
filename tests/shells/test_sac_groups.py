"""The single-active-consumer decisions (shells/broker/sac.py) as a cluster's coordinator uses them:
members joining with the order an earlier coordinator gave them, with the state their node reports
(an active consumer stays active, a step-down still awaited is awaited, two claiming to be active: the
later one yields), and a hold that keeps a new coordinator from activating anyone while it gathers the
members. The lone-node behaviour is covered by tests/shells/test_rmq_session.py's SAC tests."""

from riverbed.shells.broker.sac import ACTIVE, STEPPING_DOWN, SacGroups


class Member:
    def __init__(self, name, log):
        self.name = name
        self.log = log

    def sac_activate(self):
        self.log.append(("activate", self.name))

    def sac_step_down(self):
        self.log.append(("step_down", self.name))


def members(log, *names):
    return [Member(n, log) for n in names]


def test_plain_stream_first_registered_then_next_in_order():
    log = []
    g = SacGroups()
    a, b, c = members(log, "a", "b", "c")
    assert [g.register("s", "grp", m) for m in (a, b, c)] == [1, 2, 3]
    assert log == [("activate", "a")]
    g.unregister("s", "grp", a)
    assert log[-1] == ("activate", "b") and g.active_of("s", "grp") is b
    g.unregister("s", "grp", c)
    g.unregister("s", "grp", b)
    assert len(g) == 0


def test_rebuilt_group_keeps_the_orders_and_the_active_member():
    log = []
    held = {"s": True}
    g = SacGroups(hold=lambda stream: held["s"])
    b, c, d = members(log, "b", "c", "d")
    # the re-registrations arrive in any order; c was active under the former coordinator
    g.register("s", "grp", d, order=4)
    g.register("s", "grp", c, order=3, state=ACTIVE)
    g.register("s", "grp", b, order=2)
    held["s"] = False
    g.rebalance_stream("s")
    assert log == [] and g.active_of("s", "grp") is c       # c goes on; nobody else is told anything
    assert g.register("s", "grp", Member("e", log)) == 5          # a new member goes after every order seen
    g.unregister("s", "grp", c)
    assert log == [("activate", "b")]                              # then the lowest order


def test_hold_gathers_then_activates_the_lowest_order():
    log = []
    held = {"s": True}
    g = SacGroups(hold=lambda stream: held.get(stream, False))
    b, c = members(log, "b", "c")
    g.register("s", "grp", c, order=3)
    g.register("s", "grp", b, order=2)
    assert log == []                       # nothing decided while held
    held["s"] = False
    g.rebalance_stream("s")
    assert log == [("activate", "b")]


def test_two_claiming_active_the_later_steps_down():
    log = []
    g = SacGroups(hold=lambda stream: True)
    a, b = members(log, "a", "b")
    g.register("s", "grp", a, order=1, state=ACTIVE)
    g.register("s", "grp", b, order=2, state=ACTIVE)
    assert log == [("step_down", "b")] and g.active_of("s", "grp") is a


def test_awaited_step_down_is_awaited_by_the_new_coordinator():
    log = []
    g = SacGroups()
    a, b = members(log, "a", "b")
    g.register("s", "grp", a, order=1, partition_index=1, state=STEPPING_DOWN)
    g.register("s", "grp", b, order=2, partition_index=1)
    assert log == []                       # b waits for a's answer
    g.stepped_down("s", "grp", a)
    assert log == [("activate", "b")]      # partition 1 of 2 members: the second


def test_forget_stream_tells_no_one():
    log = []
    g = SacGroups()
    a, b = members(log, "a", "b")
    g.register("s", "grp", a)
    g.register("s", "grp", b)
    g.forget_stream("s")
    assert log == [("activate", "a")] and g.streams() == set()
