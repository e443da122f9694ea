"""bench.py's roofline on the CPU: % of the attainable read and % of the spec sheet's bandwidth side by side."""

import dataclasses
import io

import pytest

from fdpp_rewrite.engine.bench import add_roofline, print_table
from fdpp_rewrite.gpu.device import spec_memory_bandwidth


def _point(ms, **extra):
    return {"kernels": "fdpp", "batch": 64, "context": 512, "tokens_per_s": 64 / ms * 1e3, "ms_per_step": ms,
            "ms_per_step_median": ms, "first_token_ms": 40.0, **extra}


def test_the_roofline_against_the_read_and_the_spec():
    points = [_point(3.8, weight_bytes=13.2e9, kv_bytes_mean=0.1e9), _point(2.0)]
    add_roofline(points, 4.2e12, 4.8e12)
    assert points[0]["roofline_pct"] == pytest.approx(100 * 13.3e9 / 4.2e12 * 1e3 / 3.8)
    assert points[0]["roofline_spec_pct"] == pytest.approx(100 * 13.3e9 / 4.8e12 * 1e3 / 3.8)
    assert points[0]["roofline_spec_pct"] < points[0]["roofline_pct"]
    assert "roofline_ms" not in points[1]
    unknown = [_point(3.8, weight_bytes=13.2e9, kv_bytes_mean=0.1e9)]
    add_roofline(unknown, 4.2e12)  # a GPU with no spec figure: the read's column only
    assert "roofline_pct" in unknown[0] and "roofline_spec_pct" not in unknown[0]
    stream = io.StringIO()
    print_table(points + unknown, stream)
    header, first, second, third = stream.getvalue().splitlines()
    assert "% read" in header and "% spec" in header
    assert f"{points[0]['roofline_pct']:.1f}" in first and f"{points[0]['roofline_spec_pct']:.1f}" in first
    assert second.split()[-3:] == ["-", "-", "-"] and third.split()[-2:] == ["-", "-"]


def test_spec_bandwidth_by_device_name():
    assert spec_memory_bandwidth("NVIDIA H200") == 4.8e12
    assert spec_memory_bandwidth("a GPU nobody listed") is None


def test_a_stream_read_too_small_to_pass_the_l2_is_refused(capsys):
    from fdpp_rewrite.cli import main

    assert main(["bench", "no-such-engine", "--stream-gib", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--stream-gib 0.1 is too small" in err and len(err.strip().splitlines()) == 1


def test_the_gpt_fast_peer_takes_the_engines_model_and_refuses_other_layouts():
    from fdpp_rewrite.engine.bench import gptfast_config
    from fdpp_rewrite.errors import FdppError
    from fdpp_rewrite.models import get_config

    manifest = {"model": {"config": dataclasses.asdict(get_config("llama2-7b"))}, "num_layers": 2}
    assert gptfast_config(manifest, cuda=True).num_layers == 2  # the engine's layers, not the preset's 32
    opt = {"model": {"config": dataclasses.asdict(get_config("opt-6.7b"))}, "num_layers": 2}
    with pytest.raises(FdppError, match="not a plain Llama layout .family opt"):
        gptfast_config(opt, cuda=True)
    with pytest.raises(FdppError, match="no model config"):
        gptfast_config({"model": {"config": None}, "num_layers": 2}, cuda=True)


def test_the_table_compares_fdpp_with_each_peer():
    stream = io.StringIO()
    print_table([_point(4.0), {**_point(5.0), "kernels": "gptfast"}, {**_point(8.0), "kernels": "torch"}], stream)
    text = stream.getvalue()
    assert "fdpp kernels 1.25x the gpt-fast recipe's decode tokens/s" in text
    assert "fdpp kernels 2.00x the torch baseline's decode tokens/s" in text
