"""The off-grid copy used to compare 4-bit formats on equal terms (gpu_worker/bench/offgrid_model.py)."""
import json

import torch
from safetensors.torch import load_file, save_file

from gpu_worker.bench.offgrid_model import write_offgrid_model


def test_projections_leave_the_q4_1_grid_by_at_most_half_a_step_and_the_rest_is_copied(tmp_path):
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8, 64), generator=gen).float()
    step, low = torch.rand(8, 2, 1, generator=gen) + 0.1, torch.randn(8, 2, 1, generator=gen)
    codes[:, 0::32] = 0
    codes[:, 31::32] = 15
    on_grid = (codes.view(8, 2, 32) * step + low).view(8, 64)    # a Q4_1 weight, each group spanning its grid
    state = {"model.layers.0.self_attn.q_proj.weight": on_grid,
             "model.embed_tokens.weight": torch.randn(10, 64, generator=gen),
             "model.norm.weight": torch.ones(64)}
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    save_file(state, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"hidden_size": 64}))
    (src / "tokenizer.json").write_text("{}")

    assert write_offgrid_model(src, dst, seed=1) == 1
    out = load_file(dst / "model.safetensors")
    assert torch.equal(out["model.embed_tokens.weight"], state["model.embed_tokens.weight"])
    assert torch.equal(out["model.norm.weight"], state["model.norm.weight"])
    moved = (out["model.layers.0.self_attn.q_proj.weight"] - on_grid).view(8, 2, 32)
    assert (moved.abs() <= step / 2 + 1e-6).all()
    residue = torch.remainder(moved / step, 1.0)          # where each weight now sits in its cell
    assert residue.std() > 0.2                            # spread over the cell, not on the grid
    assert json.loads((dst / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (dst / "tokenizer.json").exists()
    again = tmp_path / "again"
    write_offgrid_model(src, again, seed=1)
    assert torch.equal(load_file(again / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"],
                       out["model.layers.0.self_attn.q_proj.weight"])
