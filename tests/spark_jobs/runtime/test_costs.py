"""Recomputing a table while that is cheaper than applying its changes, probing now and then."""

from __future__ import annotations

from spark_jobs.runtime.costs import COMPACT_APPENDS, PROBE_EVERY, CostChoice


def warm(choice: CostChoice) -> CostChoice:
    """``choice`` after the process's first (cold, unrecorded) barrier of applied changes."""
    choice.measured(whole=False, seconds=60.0)
    return choice


def test_changes_are_applied_until_a_barrier_of_them_costs_more_than_recomputing() -> None:
    choice = CostChoice()
    assert not choice.whole()  # nothing measured: apply
    choice.measured(whole=True, seconds=4.0)
    assert not choice.whole()  # no barrier applied yet
    warm(choice)
    choice.measured(whole=False, seconds=4.5)
    assert not choice.whole()  # within the margin (noise)
    choice.measured(whole=False, seconds=9.0)
    assert choice.whole()


def test_the_first_changes_a_process_applies_are_applied_again_before_they_count() -> None:
    choice = CostChoice()
    choice.measured(whole=True, seconds=4.0)
    choice.measured(whole=False, seconds=30.0)  # cold: the MERGE's code compiled on the way
    assert not choice.whole() and choice.applied_s is None and choice.since_probe == 1
    choice.measured(whole=False, seconds=2.0)
    assert not choice.whole() and choice.applied_s == 2.0
    restarted = CostChoice()  # a new process is cold again, whatever an earlier one measured
    restarted.restore({"whole_s": 4.0, "applied_s": 9.0, "since_probe": PROBE_EVERY - 1.0})
    assert not restarted.whole()  # a probe is due
    restarted.measured(whole=False, seconds=30.0)
    assert not restarted.whole()  # the probe was cold: probed again
    restarted.measured(whole=False, seconds=9.0)
    assert restarted.whole()


def test_while_recomputing_wins_every_tenth_barrier_applies_the_changes_again() -> None:
    choice = warm(CostChoice())
    choice.measured(whole=True, seconds=4.0)
    choice.measured(whole=False, seconds=9.0)
    ways = []
    for _ in range(2 * PROBE_EVERY):
        whole = choice.whole()
        ways.append(whole)
        choice.measured(whole, 4.0 if whole else 9.0)
    assert ways.count(False) == 2 and not ways[PROBE_EVERY - 1] and all(ways[:PROBE_EVERY - 1])
    choice.measured(whole=False, seconds=1.0)  # the changes got near each other: applying wins again
    assert not choice.whole()


def test_probing_every_barrier_always_applies_the_changes() -> None:
    choice = warm(CostChoice(probe_every=1))  # (tests of the incremental paths)
    choice.measured(whole=True, seconds=1.0)
    choice.measured(whole=False, seconds=9.0)
    assert not choice.whole()


def test_a_restarted_job_goes_on_from_what_an_earlier_run_measured() -> None:
    earlier = warm(CostChoice())
    earlier.measured(whole=True, seconds=4.0)
    earlier.measured(whole=False, seconds=9.0)
    restarted = CostChoice()
    restarted.restore(earlier.state())
    assert restarted.whole() and restarted.state() == {"whole_s": 4.0, "applied_s": 9.0, "since_probe": 0.0}
    restarted.measured(whole=True, seconds=3.0)
    restarted.restore(earlier.state())  # measured since: kept
    assert restarted.whole_s == 3.0


def test_a_changelog_table_is_compacted_after_its_appends_or_once_they_weigh_a_tenth_of_it() -> None:
    choice = CostChoice()
    assert choice.compact_due(1_000)  # never compacted (nor built) here: compact
    choice.laid_out(True, 100_000_000)
    for _ in range(COMPACT_APPENDS - 1):
        assert not choice.compact_due(105_000_000)
        choice.laid_out(False)
    assert not choice.compact_due(105_000_000)
    assert choice.compact_due(110_000_000)  # the appends hold a tenth of the compacted table
    choice.laid_out(False)
    assert choice.compact_due(100_000_001)  # COMPACT_APPENDS appends
    restarted = CostChoice()
    restarted.restore(choice.state())
    assert (restarted.compacted_bytes, restarted.appends) == (100_000_000, COMPACT_APPENDS)
