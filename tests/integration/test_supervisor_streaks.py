"""The supervisor's crash streak (``--crash-window-ms``): with real forked children, crashes of children
that ran at least the window apart start a new streak, and crashes in quick succession add up to the
cap. The supervisor runs in this process (its loop and signal handling as ``tenure worker`` runs
them), with a window of 0.8 s and a cap of 3 instead of 60 s and 10."""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from tenure_cli.supervisor import (
    GIVEN_UP,
    ChildSpec,
    RestartPolicy,
    Slot,
    Supervisor,
    add_supervision_arguments,
    restart_policy,
)

WINDOW_S = 0.8
#: How long a child runs before it crashes: beyond the window (however late it is reaped), or at once.
LONG_S, AT_ONCE_S = 0.9, 0.0


@dataclass
class Recorder:
    """The supervisor's report: the streak at each crash; stops the supervisor once a slot is given up."""

    beat_interval_s: float = 60.0
    streaks: list[int] = field(default_factory=list)
    given_up_slots: list[int] = field(default_factory=list)

    def started(self, slots: Sequence[Slot]) -> None:
        pass

    def crashed(self, slot: Slot) -> None:
        self.streaks.append(slot.crashes)

    def restarted(self, slot: Slot) -> None:
        pass

    def given_up(self, slot: Slot) -> None:
        self.streaks.append(slot.crashes)
        self.given_up_slots.append(slot.index)
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's own handler: it stops, nothing left to run

    def beat(self) -> None:
        pass

    def stopped(self) -> None:
        pass


def crash_after(seconds: float) -> ChildSpec:
    def main() -> None:
        time.sleep(seconds)
        os._exit(3)

    return ChildSpec(main=main)


@pytest.mark.timeout(60)
def test_crashes_beyond_the_window_start_a_new_streak_and_crashes_within_it_reach_the_cap() -> None:
    # Given a slot whose children crash: four after running beyond the window (more than the cap), then
    # one at once, one beyond the window, and two at once
    runs = [LONG_S, LONG_S, LONG_S, LONG_S, AT_ONCE_S, LONG_S, AT_ONCE_S, AT_ONCE_S]
    launched: list[float] = []

    def launch(index: int) -> ChildSpec:
        launched.append(runs[len(launched)])
        return crash_after(launched[-1])

    recorder = Recorder()
    policy = RestartPolicy(max_crashes=3, window_s=WINDOW_S, backoff_s=0.01, backoff_max_s=0.05)
    supervisor = Supervisor("worker", 1, launch, policy, lambda: recorder)

    # When it runs until the slot is given up
    outcome = supervisor.run()

    # Then each crash after a run beyond the window counts as the first of a new streak (four of them
    # never reach the cap of 3); crashes in quick succession add up, and the third in a row gives it up
    assert recorder.streaks == [1, 1, 1, 1, 2, 1, 2, 3]
    assert recorder.given_up_slots == [0] and outcome.given_up == (0,)
    assert launched == runs
    (slot,) = supervisor.slots
    assert (slot.state, slot.restarts, slot.last_exit) == (GIVEN_UP, 7, "exited with code 3")
    assert outcome.signal == signal.SIGTERM and outcome.exit_code == 1


def test_the_window_is_the_crash_window_ms_option() -> None:
    parser = argparse.ArgumentParser()
    add_supervision_arguments(parser, role="worker")
    assert restart_policy(parser.parse_args([])).window_s == 60.0
    policy = restart_policy(parser.parse_args(["--crash-window-ms", "250", "--max-crashes", "4"]))
    assert (policy.window_s, policy.max_crashes) == (0.25, 4)
    with pytest.raises(SystemExit):
        parser.parse_args(["--crash-window-ms", "-1"])
