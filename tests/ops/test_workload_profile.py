"""``python -m gpu_worker.bench.workload_profile`` files each forward pass by kind and rows,
with the time of the parts timed inside it: checked on a stand-in model whose forward
advances a fake clock, so every figure is known exactly."""
from collections import defaultdict
from types import SimpleNamespace

import torch

from gpu_worker.bench.decode_profile import Timers
from gpu_worker.bench.workload_profile import bucket, file_forwards, report_forwards


def test_buckets_are_the_row_ranges_the_report_names():
    assert [bucket(n) for n in (1, 2, 8, 9, 12, 13, 48, 49, 1022, 1024, 1025)] == [
        "1", "2-8", "2-8", "9-12", "9-12", "13-24", "25-48", "49-128", "513-1024", "513-1024", ">1024"]


def test_forwards_are_filed_by_kind_and_rows_with_their_inner_parts(capsys):
    now = [0.0]
    timers = Timers(clock=lambda: now[0])
    attention = timers.wrap("attention", lambda seconds: now.__setitem__(0, now[0] + seconds))

    def forward(input_ids, positions, kv_caches, plan, keep=None):
        attention(0.25)                     # timed inside the pass
        now[0] += 1.0                       # the rest of the pass

    model = SimpleNamespace(forward=forward, fused_decode=None)
    steps = defaultdict(lambda: defaultdict(float))
    file_forwards(model, timers, steps)

    def step(rows, num_decodes, seq_lens):
        plan = SimpleNamespace(meta=SimpleNamespace(num_decodes=num_decodes, seq_lens=seq_lens))
        model.forward(torch.zeros(rows, dtype=torch.long), None, [], plan)

    step(5, 5, [10, 20, 30, 40, 50])        # timers off: not filed
    with timers.running():
        step(5, 5, [10, 20, 30, 40, 50])    # all decode rows
        step(3, 3, [7, 8, 9])
        step(600, 2, [100, 200, 400])       # a prefill chunk beside two decode rows
        model.fused_decode = SimpleNamespace()
        step(1, 1, [64])                    # the fused C layers take it
    assert set(steps) == {("decode", "2-8"), ("prefill", "513-1024"), ("fused decode", "1")}
    d = steps[("decode", "2-8")]
    assert (d["calls"], d["rows"], d["context"]) == (2, 8, 174)
    assert d["seconds"] == 2.5 and d["attention"] == 0.5 and d["matmul"] == 0.0
    p = steps[("prefill", "513-1024")]
    assert (p["calls"], p["rows"], p["context"], p["seconds"], p["attention"]) == (1, 600, 700, 1.25, 0.25)
    report_forwards(steps, runs=1)
    lines = {line.split()[0] + " " + line.split()[1]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert lines["decode 2-8"][2:7] == ["2.500", "2", "1250.00", "4.0", "22"]   # ctx/seq: 174 over 8 rows
    assert lines["prefill 513-1024"][6] == "700"                                # a prefill call's context
