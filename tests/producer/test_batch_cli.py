"""``fleet batch`` as a user runs it: both formats, input order, stable ids, resume after
C-c, progress when stderr is a file, and one-line errors with their exit codes."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from redis_server import REPO, free_port, subprocess_env

from producer.batch_io import line_request

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]


def _fleet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def _openai_line(i: int, **body) -> dict:
    if i % 2:
        body = {"model": "m", "prompt": PROMPT, "max_tokens": 3 + i, "ignore_eos": True, **body}
        return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions", "body": body}
    body = {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}],
            "max_tokens": 3 + i, "ignore_eos": True, "temperature": 0, **body}
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": body}


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))


def test_openai_format_in_input_order_keeps_custom_ids(workers, redis_server, tmp_path):
    workers.start()
    rows = [_openai_line(i) for i in range(8)]
    rows.insert(3, {"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "m"}})
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    forced = _openai_line(10, tools=[tool], max_tokens=16, tool_choice={
        "type": "function", "function": {"name": "f"}})  # a forced tool call, as the gateway
    del forced["body"]["ignore_eos"]  # (refused with a grammar)
    rows.append(forced)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, rows)
    run = _fleet("batch", "--redis-url", redis_server.url, "--ordered", "--window", "3",
                 str(src), str(out))
    assert run.returncode == 1, run.stderr  # one line failed; its output line says why
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == [r["custom_id"] for r in rows]
    bad = lines[3]
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["param"] == "url"
    for row, line in zip(rows, lines):
        if row["custom_id"] == "bad-url":
            continue
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["id"].startswith("batch_req_")
        if "tools" in row["body"]:
            assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
            continue
        assert body["usage"]["completion_tokens"] == row["body"]["max_tokens"]
        kind = "chat.completion" if row["url"].endswith("chat/completions") else "text_completion"
        assert body["object"] == kind
    again = _fleet("batch", "--redis-url", redis_server.url, str(src), str(out))
    assert again.returncode == 0, again.stderr
    assert len(out.read_text().splitlines()) == len(rows)  # nothing redone


def test_fleet_ids_do_not_move_when_a_line_is_inserted_above():
    line = json.dumps({"prompt": "hello", "max_tokens": 4})
    first = line_request(line + "\n", tenant="default", lane="batch").request_id
    other = line_request(json.dumps({"prompt": "x"}), tenant="default", lane="batch")
    assert first == line_request(line, tenant="default", lane="batch").request_id
    assert first != other.request_id
    given = line_request(json.dumps({"prompt": "y", "request_id": "mine"}), tenant="t",
                         lane="batch")
    assert given.request_id == "mine"


def test_interrupt_says_how_to_resume_and_the_rerun_finishes(workers, redis_server, tmp_path):
    workers.start()
    rows = [{"prompt_token_ids": PROMPT, "max_tokens": 100 + i, "ignore_eos": True,
             "metadata": {"row": str(i)}} for i in range(10)]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, rows)
    proc = subprocess.Popen([sys.executable, "-m", "producer.cli", "batch", "--redis-url",
                             redis_server.url, "--window", "2", str(src), str(out)],
                            cwd=REPO, env=subprocess_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    written = out.read_text().count("\n")
    assert f"interrupted: {written}/10 written; rerun the same command to resume" in err
    assert written < 10
    rerun = _fleet("batch", "--redis-url", redis_server.url, "--progress-every", "0.1",
                   str(src), str(out))
    assert rerun.returncode == 0, rerun.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(x["line"] for x in lines) == list(range(1, 11))
    assert all(x["metadata"] == {"row": str(x["line"] - 1)} for x in lines)
    progress = [x for x in rerun.stderr.splitlines() if "lines (" in x]
    assert progress and progress[-1].startswith("10/10 lines (100.0%)"), rerun.stderr
    assert all("ETA" in x and "req/s" in x for x in progress)
    assert "\r" not in rerun.stderr  # plain lines when stderr is not a terminal


def test_missing_input_and_redis_down_are_one_line_errors(tmp_path, redis_server):
    missing = _fleet("batch", "--redis-url", redis_server.url, str(tmp_path / "nope.jsonl"),
                     str(tmp_path / "out.jsonl"))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "nope.jsonl" in missing.stderr
    assert "No such file" in missing.stderr and "Traceback" not in missing.stderr
    src = tmp_path / "in.jsonl"
    _write(src, [{"prompt": "hi", "max_tokens": 2}])
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    down = _fleet("batch", "--redis-url", url, str(src), str(tmp_path / "out.jsonl"))
    assert down.returncode == 3, down.stderr
    assert down.stderr.strip().count("\n") == 0 and "Traceback" not in down.stderr
    assert "Redis at redis://:***@127.0.0.1" in down.stderr and "secret" not in down.stderr
    (tmp_path / "junk.jsonl").write_text("not ours\n")
    junk = _fleet("batch", "--redis-url", redis_server.url, str(src), str(tmp_path / "junk.jsonl"))
    assert junk.returncode == 2 and "not an output line" in junk.stderr
    assert (tmp_path / "junk.jsonl").read_text() == "not ours\n"


def test_progress_counts_earlier_lines_and_estimates_the_rest(monkeypatch):
    import io

    from producer import batch_progress

    clock = iter([0.0, 10.0, 20.0, 20.0, 20.0])  # t0, then one reading per add / line
    monkeypatch.setattr(batch_progress.time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()  # not a terminal: plain lines
    progress = batch_progress.Progress(100, 40, every_s=5.0, stream=stream)
    progress.add(tokens=50, failed=False)  # at 10 s: shown (5 s passed)
    progress.add(tokens=50, failed=True)  # at 20 s: shown
    lines = stream.getvalue().splitlines()
    assert lines[-1].startswith("42/100 lines (42.0%)  0.10 req/s  5.0 tok/s  1 failed")
    assert lines[-1].endswith("ETA 9m40s")  # 58 lines left at 0.1 lines/s
