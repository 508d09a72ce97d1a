"""The watchdog's rule: behind, and nothing moved for the bound (which doubles per restart)."""

from __future__ import annotations

from collections.abc import Hashable

from spark_jobs.ops.watchdog import LOOK_EVERY_S, Watchdog


def nothing() -> Hashable:
    raise AssertionError("a job that is not behind is not looked at")


def test_a_job_behind_with_nothing_moving_is_stuck_after_the_bound() -> None:
    dog = Watchdog(stuck_after_s=60)
    assert dog.observe("j", done=10, ready=12, look=lambda: (5, 0), now=0) is None
    assert dog.observe("j", done=10, ready=40, look=lambda: (5, 0), now=59) is None  # barriers keep coming
    assert dog.observe("j", done=10, ready=41, look=lambda: (5, 0), now=61) == 61


def test_a_long_barrier_whose_spark_work_moves_is_never_stuck() -> None:
    dog = Watchdog(stuck_after_s=60)
    for minute in range(10):  # a barrier of ten minutes: a task finishes or a Spark job starts every 50 s
        assert dog.observe("j", done=10, ready=11, look=lambda m=minute: (5, m), now=minute * 50) is None
    assert dog.observe("j", done=10, ready=11, look=lambda: (5, 9), now=9 * 50 + 61) == 61


def test_a_job_with_nothing_to_do_is_never_stuck() -> None:
    dog = Watchdog(stuck_after_s=60)
    for t in range(0, 1000, 10):  # waiting for its sources: nothing ready
        assert dog.observe("j", done=10, ready=10, look=nothing, now=t) is None
    assert dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=1000) is None  # the clock starts now
    assert dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=1059) is None


def test_each_restart_doubles_the_bound_until_the_job_has_caught_up() -> None:
    dog = Watchdog(stuck_after_s=60)
    dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=0)
    assert dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=61) == 61
    dog.restarted("j", now=61)
    assert dog.bound("j") == 120
    assert dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=150) is None
    assert dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=182) == 121
    dog.restarted("j", now=182)
    assert dog.bound("j") == 240
    dog.observe("j", done=11, ready=14, look=lambda: (9, 0), now=200)  # its table advanced, still behind
    assert dog.bound("j") == 240
    assert dog.observe("j", done=11, ready=14, look=lambda: (9, 0), now=300) is None  # 100 s still: not stuck at 240
    dog.observe("j", done=14, ready=14, look=lambda: (9, 0), now=310)  # caught up
    assert dog.bound("j") == 60


def test_a_job_forgotten_starts_afresh_and_zero_disables_the_watchdog() -> None:
    dog = Watchdog(stuck_after_s=60)
    dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=0)
    dog.forget("j")  # it failed and waits for its restart
    assert dog.observe("j", done=10, ready=11, look=lambda: (1, 0), now=100) is None
    off = Watchdog(stuck_after_s=0)
    off.observe("j", done=10, ready=11, look=lambda: (1, 0), now=0)
    assert off.observe("j", done=10, ready=11, look=lambda: (1, 0), now=10**6) is None


def test_a_job_behind_is_looked_at_once_every_few_seconds_and_once_more_before_it_is_stuck() -> None:
    dog = Watchdog(stuck_after_s=60)
    looks: list[float] = []

    def look_at(now: float) -> Hashable:
        looks.append(now)
        return (5, 0)

    stuck = [dog.observe("j", done=10, ready=12, look=lambda t=t: look_at(t), now=t) for t in range(62)]
    assert stuck[:61] == [None] * 61 and stuck[61] == 61
    assert looks == [float(t) for t in range(0, 61, int(LOOK_EVERY_S))] + [61.0]  # each 10 s, then before stuck
    # a change seen by that last look is progress: not stuck
    dog.observe("k", done=10, ready=12, look=lambda: (5, 0), now=0)
    for t in range(1, 61):
        dog.observe("k", done=10, ready=12, look=lambda: (5, 0), now=t)
    assert dog.observe("k", done=10, ready=12, look=lambda: (5, 1), now=61) is None


def test_a_short_bound_looks_at_every_observation() -> None:
    dog = Watchdog(stuck_after_s=5)
    looks = 0

    def look() -> Hashable:
        nonlocal looks
        looks += 1
        return (1, 0)

    for t in range(5):
        dog.observe("j", done=10, ready=11, look=look, now=t)
    assert looks == 5
