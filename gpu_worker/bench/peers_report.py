"""The pure parts of ``fleet bench peers``: greedy agreement against this engine, the figures
of one engine's run, and the table printed at the end."""
from __future__ import annotations

import statistics


def agreement(ref: list[list[int]], other: list[list[int]]) -> dict:
    """Requests token-identical to ``ref`` (count), and the mean over requests of the fraction
    of ``ref``'s tokens before the first divergence (1.0 where identical)."""
    if len(ref) != len(other):
        raise ValueError(f"{len(ref)} reference outputs but {len(other)} to compare")
    fractions = []
    for r, o in zip(ref, other):
        k = next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), min(len(r), len(o)))
        fractions.append(k / len(r) if r else 1.0)
    return {"identical": sum(r == o for r, o in zip(ref, other)), "requests": len(ref),
            "prefix_fraction": sum(fractions) / len(fractions) if fractions else 1.0}


def figures(run: dict) -> dict:
    """Throughput (useful output tokens / workload wall time) and batch-1 tokens/s of a run
    returned by peers_job.run_job (the outputs are kept aside)."""
    tokens = sum(len(o) for o in run["outputs"])
    row = {k: v for k, v in run.items() if k != "outputs"}
    row.update(output_tokens=tokens, throughput_tok_s=tokens / run["workload_s"],
               batch1_decode_tok_s=run["batch1"]["decode_tok_s"], batch1_e2e_tok_s=run["batch1"]["e2e_tok_s"])
    return row


def table(rows: dict[str, dict]) -> str:
    """A Markdown table of every engine that ran, and a line for each that was skipped."""
    lines = ["| engine | throughput, tokens/s | batch 1 decode, tokens/s | batch 1 end to end, tokens/s "
             "| outputs vs this engine |", "|---|---|---|---|---|"]
    skipped = []
    for name, row in rows.items():
        if "skipped" in row:
            skipped.append(f"{name}: skipped ({row['skipped']})")
            continue
        agree = row.get("agreement")
        vs = "—" if agree is None else (f"{agree['identical']}/{agree['requests']} identical, "
                                        f"{agree['prefix_fraction']:.1%} of tokens before divergence")
        lines.append(f"| {name} | {row['throughput_tok_s']:.1f} | {row['batch1_decode_tok_s']:.1f} "
                     f"| {row['batch1_e2e_tok_s']:.1f} | {vs} |")
    return "\n".join(lines + skipped)


ROUND_FIGURES = ("throughput_tok_s", "batch1_decode_tok_s", "batch1_e2e_tok_s")


def summarize_rounds(runs: list[dict]) -> dict:
    """One engine's rounds (peers_rounds) as one row: each figure the median over the rounds,
    every round's figures under "rounds", and the first round's outputs (greedy: every round
    must give the same ones, else the row says so under "outputs_differ_in_rounds")."""
    rows = [figures(r) for r in runs]
    row = {**rows[0], "outputs": runs[0]["outputs"], "rounds": [{k: r[k] for k in ROUND_FIGURES} for r in rows]}
    for k in ROUND_FIGURES:
        row[k] = statistics.median(r[k] for r in rows)
    differ = [i for i, r in enumerate(runs) if r["outputs"] != runs[0]["outputs"]]
    if differ:
        row["outputs_differ_in_rounds"] = differ
    return row


def paired_ratios(a: dict, b: dict) -> dict:
    """Per round, a's figure over b's (the two measured in the same round), and the median
    of those ratios, for throughput and batch-1 decode; rows from summarize_rounds."""
    out = {}
    for k in ("throughput_tok_s", "batch1_decode_tok_s"):
        ratios = [x[k] / y[k] for x, y in zip(a["rounds"], b["rounds"])]
        out[k] = {"per_round": ratios, "median": statistics.median(ratios)} if ratios else None
    return out
