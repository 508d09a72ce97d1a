"""The watchdog's rule: behind, and nothing moved for the bound (which doubles per restart)."""

from __future__ import annotations

from spark_jobs.ops.watchdog import Watchdog


def test_a_job_behind_with_nothing_moving_is_stuck_after_the_bound() -> None:
    dog = Watchdog(stuck_after_s=60)
    assert dog.observe("j", done=10, ready=12, activity=(5, 0), now=0) is None
    assert dog.observe("j", done=10, ready=40, activity=(5, 0), now=59) is None  # barriers keep coming
    assert dog.observe("j", done=10, ready=41, activity=(5, 0), now=61) == 61


def test_a_long_barrier_whose_spark_work_moves_is_never_stuck() -> None:
    dog = Watchdog(stuck_after_s=60)
    for minute in range(10):  # a barrier of ten minutes: a task finishes or a Spark job starts every 50 s
        assert dog.observe("j", done=10, ready=11, activity=(5, minute), now=minute * 50) is None
    assert dog.observe("j", done=10, ready=11, activity=(5, 9), now=9 * 50 + 61) == 61


def test_a_job_with_nothing_to_do_is_never_stuck() -> None:
    dog = Watchdog(stuck_after_s=60)
    for t in range(0, 1000, 10):  # waiting for its sources: nothing ready
        assert dog.observe("j", done=10, ready=10, activity=None, now=t) is None
    assert dog.observe("j", done=10, ready=11, activity=(1, 0), now=1000) is None  # the clock starts now
    assert dog.observe("j", done=10, ready=11, activity=(1, 0), now=1059) is None


def test_each_restart_without_progress_doubles_the_bound_and_an_exact_point_resets_it() -> None:
    dog = Watchdog(stuck_after_s=60)
    dog.observe("j", done=10, ready=11, activity=(1, 0), now=0)
    assert dog.observe("j", done=10, ready=11, activity=(1, 0), now=61) == 61
    dog.restarted("j", now=61)
    assert dog.bound("j") == 120
    assert dog.observe("j", done=10, ready=11, activity=(1, 0), now=150) is None
    assert dog.observe("j", done=10, ready=11, activity=(1, 0), now=182) == 121
    dog.restarted("j", now=182)
    assert dog.bound("j") == 240
    dog.observe("j", done=11, ready=12, activity=(9, 0), now=200)  # its table advanced
    assert dog.bound("j") == 60


def test_a_job_forgotten_starts_afresh_and_zero_disables_the_watchdog() -> None:
    dog = Watchdog(stuck_after_s=60)
    dog.observe("j", done=10, ready=11, activity=(1, 0), now=0)
    dog.forget("j")  # it failed and waits for its restart
    assert dog.observe("j", done=10, ready=11, activity=(1, 0), now=100) is None
    off = Watchdog(stuck_after_s=0)
    off.observe("j", done=10, ready=11, activity=(1, 0), now=0)
    assert off.observe("j", done=10, ready=11, activity=(1, 0), now=10**6) is None
