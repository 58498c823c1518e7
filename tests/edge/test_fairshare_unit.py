"""FairShare.plan: who gets a worker's free places within a lane (pure)."""
from __future__ import annotations

from gpu_worker.edge.fairshare import FairShare, Held


def _serve(fair: FairShare, weights: dict[str, float], rounds: int, room: int,
           cost: int = 100, caps: dict | None = None) -> dict[str, int]:
    """Both tenants always have work; each read request holds ``cost`` tokens until the
    round after next (a worker whose places turn over)."""
    held = {t: Held() for t in weights}
    got = {t: 0 for t in weights}
    for _ in range(rounds):
        plan = fair.plan({t: 1000 for t in weights}, weights, held, caps or {}, room)
        for t, n in plan.items():
            got[t] += n
            held[t].requests += n
            held[t].tokens += n * cost
            for _ in range(n):
                fair.charge(t, cost, weights[t])
        for t in held:  # half of what each holds finishes
            held[t].tokens //= 2
            held[t].requests //= 2
    return got


def test_places_follow_the_weights():
    got = _serve(FairShare(), {"a": 3.0, "b": 1.0}, rounds=200, room=4)
    assert 2.5 < got["a"] / got["b"] < 3.5, got


def test_equal_weights_share_equally():
    got = _serve(FairShare(), {"a": 1.0, "b": 1.0}, rounds=100, room=3)
    assert abs(got["a"] - got["b"]) <= 2, got


def test_a_newcomer_is_served_first_when_one_tenant_holds_the_worker():
    fair = FairShare()
    held = {"flood": Held(requests=8, tokens=8 * 300)}
    plan = fair.plan({"flood": 200, "newcomer": 5}, {"flood": 1.0, "newcomer": 1.0}, held, {}, 1)
    assert plan == {"newcomer": 1}


def test_an_idle_tenant_banks_no_credit():
    """b sat idle while a was served for a long time; once b has work it gets its share
    from now on, not everything until it has caught up."""
    fair = FairShare()
    fair.charge("b", 100, 1.0)
    for _ in range(1000):
        fair.charge("a", 100, 1.0)
    held = {"a": Held(), "b": Held()}
    plan = fair.plan({"a": 100, "b": 100}, {"a": 1.0, "b": 1.0}, held, {}, 10)
    assert plan["a"] >= 4 and plan["b"] >= 4, plan


def test_shares_are_in_tokens_not_requests():
    """Requests of b cost twice those of a: a gets about twice as many places."""
    fair = FairShare()
    fair.charge("a", 100, 1.0)
    fair.charge("b", 200, 1.0)
    plan = fair.plan({"a": 100, "b": 100}, {"a": 1.0, "b": 1.0}, {}, {}, 9)
    assert plan == {"a": 6, "b": 3}, plan


def test_caps_and_backlog_bound_the_plan():
    fair = FairShare()
    held = {"a": Held(requests=2, tokens=10)}
    plan = fair.plan({"a": 50, "b": 2}, {"a": 1.0, "b": 1.0}, held, {"a": 3}, 10)
    assert plan == {"a": 1, "b": 2}
    assert fair.plan({"a": 0}, {"a": 1.0}, {}, {}, 5) == {}
