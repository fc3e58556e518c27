"""The launcher's running totals: frames and episodes go on across service restarts and resumes."""

import json

from lbc.launch import RunningTotal, last_record


def test_running_total_reads_a_drop_as_a_restart_and_a_silence_as_no_change():
    total = RunningTotal()
    assert total.update([10.0, 5.0]) == 15.0
    assert total.update([12.0, None]) == 17.0    # actor 1 did not answer: its last count stands
    assert total.update([3.0, 6.0]) == 21.0      # actor 0 restarted from zero: its 12 are kept
    assert total.update([4.0, 6.0]) == 22.0


def test_running_total_starts_from_the_resumed_count():
    assert RunningTotal(100.0).update([7.0]) == 107.0


def test_last_record_skips_a_line_cut_short(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"frames": 1.0}) + "\n" + json.dumps({"frames": 2.0}) + "\n" + '{"frames": 3')
    assert last_record(log) == {"frames": 2.0}
    assert last_record(tmp_path / "missing.jsonl") is None
