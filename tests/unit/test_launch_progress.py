"""The launcher's running totals: frames and episodes go on across service restarts and resumes."""

import json
import socket
import threading

from lbc.launch import Progress, RunningTotal, scrape
from lbc.run_folder import last_record


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


def test_progress_line_fits_120_columns_with_its_fields():
    record = {"frames": 2_949_824.0, "fps": 5371.2, "mean_return_100": 9.27, "exploit_return_100": None,
              "hns": 0.263, "eval_score": 10.88, "eval_version": 180.0, "learner_steps": 4614.0, "learner_sps": 8.35,
              "version": 184.0, "lag": 5.3, "replay_fill": 1.0}
    line = f"[{555:6.0f}s] {Progress.line(record)}"
    assert len(line) <= 120, line
    for field in ("frames 2.95M 5,371/s", "return100 9.27 HNS 0.263", "eval 10.88 v180", "learner 4614 steps 8.35/s",
                  "v184 lag 5.3"):
        assert field in line
    assert "replay" not in line                      # shown only while replay fills
    assert "replay 55%" in Progress.line({**record, "replay_fill": 0.55, "eval_score": None, "eval_version": None})


def _serve_once(answer: bytes) -> int:
    """A port on which one connection reads the request, gets `answer` and is closed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer_once() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)
        server.close()

    threading.Thread(target=answer_once, daemon=True).start()
    return server.getsockname()[1]


def test_a_scrape_cut_short_reads_as_no_answer():
    """A service killed while it answers its /metrics (the chaos test's SIGKILL) sends fewer bytes than its
    Content-Length: the launcher's scrape gives nothing, as for a service that does not answer, where it raised
    http.client.IncompleteRead and stopped the launcher."""
    body = b"# TYPE lbc_frames_total counter\nlbc_frames_total 12.0\n"
    whole = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)
    assert scrape(_serve_once(whole + body)) == {"lbc_frames_total": [({}, 12.0)]}
    cut = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 11713\r\n\r\n"
    assert scrape(_serve_once(cut + body[:20])) == {}
    assert scrape(_serve_once(whole.replace(b"%d" % len(body), b"%d" % 9) + b"lbc_frame")) == {}
