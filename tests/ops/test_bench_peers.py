"""``fleet bench peers``: the pure parts (agreement math, the table, the job every engine
gets, argument parsing) and peer discovery saying "missing" cleanly where nothing is
installed. The runs themselves need the peers and are not part of CI."""
from __future__ import annotations

import argparse
import sys

import pytest

import gpu_worker.cli as engine_cli
from gpu_worker.bench import peers, peers_discovery
from gpu_worker.bench.peers_engine import engine_options
from gpu_worker.bench.peers_job import run_job
from gpu_worker.bench.peers_llama import (
    ServerExited,
    completion_body,
    run_llama,
    server_command,
)
from gpu_worker.bench.peers_quality import compare, quality_table
from gpu_worker.bench.peers_report import agreement, figures, table
from gpu_worker.bench.workload import mixed_workload


def _args(*argv: str) -> argparse.Namespace:
    return engine_cli.build_parser().parse_args(["bench", "peers", *argv])


def test_agreement_counts_identical_requests_and_the_prefix_before_divergence():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]]
    other = [[1, 2, 3, 4], [5, 6, 0, 8], [0, 9]]
    a = agreement(ref, other)
    assert a["identical"] == 1 and a["requests"] == 3
    assert a["prefix_fraction"] == pytest.approx((1 + 0.5 + 0) / 3)
    with pytest.raises(ValueError):
        agreement(ref, other[:2])


def test_figures_and_table_report_useful_tokens_over_wall_time_and_the_skipped_peers():
    run = {"workload_s": 2.0, "outputs": [[1] * 30, [2] * 10], "warmup_s": 0.1,
           "batch1": {"decode_tok_s": 40.0, "e2e_tok_s": 35.0}}
    row = figures(run)
    assert row["throughput_tok_s"] == 20.0 and row["output_tokens"] == 40 and "outputs" not in row
    row["agreement"] = agreement(run["outputs"], run["outputs"])
    text = table({"this engine, fp32": row, "vLLM CPU, fp32": {"skipped": "not found: install it"}})
    assert "| this engine, fp32 | 20.0 | 40.0 | 35.0 | 2/2 identical, 100.0% of tokens" in text
    assert "vLLM CPU, fp32: skipped (not found: install it)" in text


def test_the_job_is_the_throughput_workload_and_a_32_token_batch1_prompt():
    job = peers.make_job(_args(), "/models/x")
    items = mixed_workload(64, 0)
    assert job["workload"] == [[i.prompt_token_ids, i.max_tokens] for i in items]
    assert len(job["batch1"]["prompt"]) == 32 and job["batch1"]["tokens"] == 128


def test_run_job_times_the_workload_and_batch1_and_refuses_short_outputs():
    calls = []

    def generate(prompts, lengths):
        calls.append(lengths)
        return [[7] * n for n in lengths]

    job = {"workload": [[[1, 2, 3], 4], [[5], 2]], "batch1": {"prompt": [1] * 32, "tokens": 16, "reps": 2}}
    out = run_job(job, generate)
    assert out["outputs"] == [[7] * 4, [7] * 2] and out["workload_s"] > 0
    assert calls[:2] == [[2], [4, 2]] and calls[2:] == [[1], [1], [16], [16]]
    assert out["batch1"]["e2e_tok_s"] > 0 and out["batch1"]["reps"] == 2
    with pytest.raises(RuntimeError, match="max_tokens"):
        run_job(job, lambda prompts, lengths: [[7] * (n - 1) for n in lengths])


def test_engine_arguments_parse_into_the_engine_options():
    args = _args("--engine-args", "--quantization int8", "--skip", "vllm,llama", "--ggufs", "F32,Q8_0")
    assert (args.engine_args, args.skip, args.ggufs, args.threads) == ("--quantization int8", "vllm,llama",
                                                                      "F32,Q8_0", 2)
    options = engine_options(None, ["--threads", "2", "--quantization", "int8"])
    assert options["quantization"] == "int8" and options["num_threads"] == 2
    assert options["enable_prefix_caching"] is False and options["dtype"] == "float32"
    assert engine_options(None, [])["quantization"] is None


def test_missing_peers_are_skipped_with_the_install_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_PEERS_DIR", str(tmp_path))
    for found in (peers_discovery.find_vllm(), peers_discovery.find_llama(), peers_discovery.find_llama_bindings()):
        assert not found.ok and "ops/bench/install_peers.sh" in found.missing
    runs = peers.run_engines(_args("--skip", "engine"), {}, tmp_path)
    assert set(runs) == {"vLLM CPU, fp32", "llama.cpp"}
    assert all("install_peers.sh" in r["skipped"] for r in runs.values())
    assert peers_discovery.versions() == ""


def test_discovery_finds_an_installed_layout(tmp_path):
    (tmp_path / "vllm-venv" / "bin").mkdir(parents=True)
    (tmp_path / "vllm-venv" / "bin" / "python").touch()
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.touch()
    (tmp_path / "vllm-preload.txt").write_text(f"{lib}\n")
    found = peers_discovery.find_vllm(tmp_path)
    assert found.ok and peers_discovery.vllm_env(found, 2)["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    (tmp_path / "llama.cpp" / "build" / "bin").mkdir(parents=True)
    (tmp_path / "llama.cpp" / "build" / "bin" / "llama-server").touch()
    (tmp_path / "gguf").mkdir()
    peers_discovery.gguf_path(tmp_path, "F32").touch()
    assert "Q4_1.gguf missing" in peers_discovery.find_llama(tmp_path).missing
    peers_discovery.gguf_path(tmp_path, "Q4_1").touch()
    found = peers_discovery.find_llama(tmp_path)
    assert found.ok and found.paths["Q4_1"].name == "SmolLM2-135M-Instruct-Q4_1.gguf"


def test_llama_server_listens_on_loopback_with_16_slots_and_greedy_fixed_length_requests(tmp_path):
    cmd = server_command(tmp_path / "llama-server", tmp_path / "m-F32.gguf", 8080, 2, "f32")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("-np") + 1] == "16"
    assert cmd[cmd.index("-t") + 1] == "2" and cmd[cmd.index("-ctk") + 1] == "f32" and "-cb" in cmd
    body = completion_body([1, 2], 5)
    assert body["n_predict"] == 5 and body["ignore_eos"] and body["temperature"] == 0
    assert body["cache_prompt"] is False and body["prompt"] == [1, 2]


FAKE_SERVER = """\
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
if "--exit-code" in args:
    sys.exit(int(args[args.index("--exit-code") + 1]))
if "--no-repack" not in args:   # as llama.cpp 0.3.36 does with a Q4_1 GGUF on an AMX Xeon
    os.kill(os.getpid(), signal.SIGSEGV)

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply({"status": "ok"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._reply({"tokens": [7] * req["n_predict"]})

ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


def _fake_llama_server(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    binary.chmod(0o755)
    return binary


def test_a_llama_server_killed_at_load_is_retried_once_without_repacking(tmp_path):
    job = {"workload": [[[1, 2, 3], 4], [[5], 2]], "batch1": {"prompt": [1] * 32, "tokens": 3, "reps": 1}}
    log = tmp_path / "llama-Q4_1.log"
    out = run_llama(_fake_llama_server(tmp_path), tmp_path / "m-Q4_1.gguf", job, 2, log)
    assert out["outputs"] == [[7] * 4, [7] * 2]
    assert out["settings"]["extra_args"] == ["--no-repack"]
    assert "SIGSEGV" in out["settings"]["retried"] and log.with_suffix(".crashed.log").exists()
    # asked for already, or an ordinary exit: no second start
    with pytest.raises(ServerExited, match="exited with 3"):
        run_llama(_fake_llama_server(tmp_path), tmp_path / "m-Q4_1.gguf", job, 2, log, ("--exit-code", "3"))
    out = run_llama(_fake_llama_server(tmp_path), tmp_path / "m-F32.gguf", job, 2, log, ("--no-repack",))
    assert "retried" not in out["settings"] and out["settings"]["kv_type"] == "f32"


def test_quality_rows_compare_each_format_with_the_engine_and_llama_f32():
    ref = {"outputs": [[1, 2, 3, 4]]}
    llama = {"F32": {"outputs": [[1, 2, 3, 4]], "perplexity": 5.0},
             "Q4_1": {"outputs": [[1, 2, 0, 0]], "perplexity": 6.0}}
    rows = compare(ref, llama)
    assert rows["F32"]["vs_engine_fp32"]["identical"] == 1
    assert rows["Q4_1"]["vs_llama_f32"]["prefix_fraction"] == 0.5
    assert "| llama.cpp Q4_1 | 6.000 | 0/1, 50.0% | 0/1, 50.0% |" in quality_table(5.0, rows)


_FAKE_RUNNER = """
import sys, time
sys.path.insert(0, 'gpu_worker/bench')
from peers_job import main

def build(job):
    def generate(prompts, lengths):
        with open(job['trace'], 'a') as f:
            f.write(job['name'] + ' ')
        return [[7] * n for n in lengths]
    if job['name'] == 'broken':
        raise SystemExit(3)
    return generate, {'version': 'fake ' + job['name']}

raise SystemExit(main(build))
"""


def test_rounds_take_turns_abba_with_every_engine_loaded_and_a_broken_runner_reported(tmp_path):
    from gpu_worker.bench.peers_rounds import Runner, run_rounds

    trace = tmp_path / "trace"
    job = {"workload": [[[1, 2], 3]], "batch1": {"prompt": [1] * 4, "tokens": 2, "reps": 1}, "trace": str(trace)}
    runners = {name: Runner([sys.executable, "-c", _FAKE_RUNNER], [], {**job, "name": name}, {},
                            tmp_path / f"{name}.log") for name in ("a", "b", "broken")}
    out = run_rounds(runners, 3, timeout_s=60)
    assert len(out["a"]) == len(out["b"]) == 3 and out["a"][0]["version"] == "fake a"
    assert out["broken"]["skipped"].startswith("failed: the runner exited with 3")
    # each round is warm-up, workload, then batch 1's two requests: 4 calls in a row per turn
    turns = trace.read_text().split()[::4]
    assert turns == ["a", "b", "b", "a", "a", "b"]


def test_rounds_summarize_to_medians_with_each_rounds_paired_ratio():
    from gpu_worker.bench.peers_report import paired_ratios, summarize_rounds

    def run(seconds, decode, outputs=None):
        return {"workload_s": seconds, "outputs": outputs or [[1] * 10], "batch1": {"decode_tok_s": decode,
                                                                                   "e2e_tok_s": decode}}
    mine = summarize_rounds([run(1.0, 50.0), run(2.0, 40.0), run(0.5, 60.0)])
    theirs = summarize_rounds([run(2.0, 25.0), run(2.0, 20.0), run(1.0, 30.0, [[2] * 10])])
    assert mine["throughput_tok_s"] == 10.0 and mine["batch1_decode_tok_s"] == 50.0
    assert [r["throughput_tok_s"] for r in mine["rounds"]] == [10.0, 5.0, 20.0]
    assert "outputs_differ_in_rounds" not in mine and theirs["outputs_differ_in_rounds"] == [2]
    ratios = paired_ratios(mine, theirs)
    assert ratios["throughput_tok_s"]["per_round"] == [2.0, 1.0, 2.0]
    assert ratios["throughput_tok_s"]["median"] == 2.0 and ratios["batch1_decode_tok_s"]["median"] == 2.0
