"""Command lines: ``fleet --version``, defaults in every ``--help``, the worker's engine flags
reaching the engine, and the README's configuration agreeing with the parsers' defaults."""
from __future__ import annotations

import argparse
import dataclasses
import re
from importlib import metadata

import pytest
from redis_server import REPO

import gpu_worker.cli as engine_cli
import producer.cli as fleet_cli
from gpu_worker.config import EngineConfig, resolve_dtype
from gpu_worker.edge import cli as worker_cli
from shared.cliargs import DefaultsFormatter

README = (REPO / "README.md").read_text()


def _parsers(parser: argparse.ArgumentParser, name: str = "fleet"):
    """``(command path, parser)`` for the parser and every sub-parser below it."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    return [*_parsers(fleet_cli.build_parser()), *_parsers(engine_cli.build_parser())]


def _has_default(action: argparse.Action) -> bool:
    d = action.default
    return bool(action.option_strings) and not (d is None or d is False or d == []
                                                or d is argparse.SUPPRESS)


def test_fleet_version_is_the_package_version(capsys):
    for main in (fleet_cli.main, engine_cli.main):
        with pytest.raises(SystemExit) as done:
            main(["--version"])
        assert done.value.code == 0
        assert capsys.readouterr().out.strip() == f"fleet {metadata.version('redis-llm-fleet')}"


def test_every_help_shows_every_default():
    names = {name for name, _ in all_parsers()}
    assert {"fleet submit", "fleet gateway", "fleet exporter", "fleet worker",
            "fleet bench throughput"} <= names
    for name, parser in all_parsers():
        assert issubclass(parser.formatter_class, DefaultsFormatter), name
        text = re.sub(r"\s+", " ", parser.format_help())
        for action in filter(_has_default, parser._actions):
            helped = action.help or ""
            assert f"(default: {action.default})" in text or "default" in helped.lower(), \
                (name, action.option_strings)


def _worker_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    worker_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_worker_flags_reach_the_engine_config():
    config = worker_cli.engine_config(_worker_args())
    assert config.dtype == "float32" and config.seed == 0 and config.max_model_len is None
    assert config.max_num_batched_tokens == EngineConfig().max_num_batched_tokens == 1024
    config = worker_cli.engine_config(_worker_args("--device", "cuda", "--max-model-len", "512",
                                                   "--seed", "7"))
    assert (config.dtype, config.max_model_len, config.seed) == ("bfloat16", 512, 7)
    assert worker_cli.engine_config(_worker_args("--device", "cuda:1", "--dtype", "float16")).dtype == "float16"
    assert resolve_dtype("auto", "cpu") == "float32" and resolve_dtype("auto", "cuda") == "bfloat16"


def test_max_model_len_refuses_longer_prompts_with_a_typed_failure(tiny_model):
    from gpu_worker.engine import EngineCore
    from gpu_worker.errors import InvalidRequestError
    from gpu_worker.sampling_params import SamplingParams

    args = _worker_args("--model", tiny_model, "--max-model-len", "16", "--kv-cache-memory", "4MiB")
    engine = EngineCore(worker_cli.engine_config(args))
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("long", list(range(1, 21)), SamplingParams(max_tokens=2))
    assert err.value.code == "prompt_too_long"
    engine.add_request("short", [1, 2, 3], SamplingParams(max_tokens=2))  # still serving


def _paragraph(start: str) -> str:
    at = README.index(start)
    return README[at:README.index("\n\n", at)]


def _defaults_by_flag() -> dict[str, list]:
    out: dict[str, list] = {}
    for _, parser in all_parsers():
        for action in parser._actions:
            for flag in action.option_strings:
                out.setdefault(flag, []).append(action.default)
    return out


def _same(text: str, default) -> bool:
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            return float(text) == float(default)
        except ValueError:
            return False
    return text == str(default)


def test_the_readme_configuration_agrees_with_the_parsers():
    flags = _defaults_by_flag()
    text = _paragraph("**Configuration.**")
    mentioned = re.findall(r"`(--[a-z][a-z0-9-]*)(?: ([^`\s]+))?`", text)
    assert len(mentioned) >= 20
    for flag, shown in mentioned:
        assert flag in flags, f"README names {flag}, which no command has"
        if shown:  # "`--flag VALUE`" states the default
            assert any(_same(shown, d) for d in flags[flag]), (flag, shown, flags[flag])


def test_the_readme_engine_options_agree_with_the_config_and_the_worker():
    text = _paragraph("**Engine options**")
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    flags = _defaults_by_flag()
    checked = 0
    for name, shown in re.findall(r"`([a-z_]+)=([^`]+)`", text):
        field = fields[name]
        if field.default is dataclasses.MISSING:
            continue  # from the environment (e.g. quant_cache=False turns a cache off)
        assert _same(shown, field.default) or shown == str(field.default), (name, shown)
        flag = "--" + name.replace("_", "-")
        if flag in flags:
            assert any(_same(shown, d) for d in flags[flag]), (flag, shown, flags[flag])
        checked += 1
    assert checked >= 5
