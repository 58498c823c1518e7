"""The engine's switches are resolved once, into EngineConfig: from the worker's flags, else
from the environment variables the README documents, read when the config is made."""
import argparse

from gpu_worker import LLM
from gpu_worker.config import EngineConfig
from gpu_worker.edge.cli import add_engine_arguments, engine_config


SWITCHES = ("FLEET_CPU_KERNELS", "FLEET_ONEDNN", "FLEET_QUANT_CACHE", "FLEET_GREEDY_SCREEN", "FLEET_HUGE_PAGES")


def test_the_environment_is_read_once_when_a_config_is_made(tiny_llama_dir, monkeypatch):
    for name in SWITCHES + ("FLEET_OPS",):
        monkeypatch.delenv(name, raising=False)
    config = EngineConfig()
    for name in SWITCHES:
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("FLEET_OPS", "triton")
    fields = ("ops_backend", "cpu_kernels", "onednn", "quant_cache", "greedy_screen", "huge_pages")
    assert tuple(getattr(config, f) for f in fields) == ("auto", True, True, True, True, True)
    later = EngineConfig()
    assert tuple(getattr(later, f) for f in fields) == ("triton", False, False, False, False, False)
    model = LLM(tiny_llama_dir, kv_cache_memory=8 << 20, ops_backend="cpu").engine.model
    assert model.ops.name == "torch" and model.packed_head is None     # the switches reached the model


def test_the_worker_flag_beats_the_environment(monkeypatch):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    monkeypatch.setenv("FLEET_OPS", "triton")
    assert engine_config(parser.parse_args([])).ops_backend == "triton"
    assert engine_config(parser.parse_args(["--ops-backend", "torch"])).ops_backend == "torch"


def test_pipeline_stages_take_the_same_switches(monkeypatch):
    from gpu_worker.parallel.pipeline import PipelineOptions

    for name in SWITCHES + ("FLEET_OPS",):
        monkeypatch.delenv(name, raising=False)
    assert (PipelineOptions().cpu_kernels, PipelineOptions().huge_pages) == (True, True)
    monkeypatch.setenv("FLEET_CPU_KERNELS", "0")
    monkeypatch.setenv("FLEET_HUGE_PAGES", "0")
    assert (PipelineOptions().cpu_kernels, PipelineOptions().huge_pages) == (False, False)
