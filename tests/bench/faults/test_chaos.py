"""bench/faults/chaos.py's arguments and figures (the campaign itself: tests/integration/test_chaos.py)."""

from __future__ import annotations

from bench.faults import chaos


def test_the_storm_preset_is_issue_58_s_campaign():
    cfg, _ = chaos.parse_args(["--storm", "--seed", "2"])
    assert (cfg.streams, cfg.minutes, cfg.fault_every, cfg.drain_s, cfg.seed) == (30, 8.0, 9.0, 150.0, 2)
    assert cfg.defaults and cfg.faults == ("kill", "kill", "stop", "api", "redis")


def test_a_kind_named_twice_weighs_twice_and_is_counted_once():
    cfg, _ = chaos.parse_args(["--faults", "kill,kill,redis"])
    assert cfg.faults.count("kill") == 2
    assert list(dict.fromkeys(cfg.faults)) == ["kill", "redis"]


def test_a_spread_says_its_worst():
    spread = chaos.Spread.of([1.0, 3.0, 2.0, 12.5])
    assert spread.most == 12.5 and "max 12.50 s" in str(spread)
    assert str(chaos.Spread.of([])) == "n=0"
