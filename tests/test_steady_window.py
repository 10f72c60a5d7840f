"""benchmarks/timed_farm.py's steady-state window: the middle of a run, after the first wave and before the last."""

from benchmarks.timed_farm import steady_window


def test_the_window_runs_from_the_first_wave_end_to_the_last_reset():
    # 2 slots, 3 waves of 2 episodes, 2 steps each, 1 s per step: resets at 0, 2, 4; steps at 1, 2 / 3, 4 / 5, 6
    times = {"resets": [0, 0, 2, 2, 4, 4], "steps": [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6], "ends": [2, 2, 4, 4, 6, 6]}
    start, stop, steps = steady_window(times, slots=2)
    assert (start, stop, steps) == (2, 4, 4)  # the steps at 3 and 4 (the window opens just after the 2nd end)


def test_a_run_without_a_middle_has_no_window():
    one_wave = {"resets": [0, 0], "steps": [1, 1, 2, 2], "ends": [2, 2]}
    assert steady_window(one_wave, slots=2) == (0.0, 0.0, 0)
    assert steady_window({"resets": [], "steps": [], "ends": []}, slots=4) == (0.0, 0.0, 0)
