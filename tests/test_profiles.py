"""Launch profiles: home-24g's qualified settings, and the refusal of contradicting explicit flags."""

from __future__ import annotations

import pytest

from runner.errors import ProfileError
from runner.launch.profiles import LaunchSettings, load_profile, resolve_launch


def test_home_24g_is_the_qualified_24_gib_launch() -> None:
    p = load_profile("home-24g")
    assert p is not None and p.name == "home-24g"
    assert p.launch == LaunchSettings(vram_budget_gib=24, server_ubatch=512, prefill_ubatch=2048, cache_slots=150,
                                      drafter="mtp", draft_depth=3, warm_fill="staging", profile="home-24g")
    assert "48 layers" in p.evidence["qualified_on"] and "512 routed experts" in p.evidence["qualified_on"]


def test_home_24g_evidence_is_what_its_run_record_measured() -> None:
    """Every [evidence.measured] figure is the median scripts/bench/fill_evidence.py reads from the qualification
    run's JSON kept under docs/perf/, on the 48-layer shape; none was typed in by hand."""
    from pathlib import Path

    from scripts.bench import fill_evidence as fill

    root = Path(__file__).resolve().parents[1]
    p = load_profile("home-24g")
    run = root / p.evidence["run_data"]
    figures, records = fill.measured(run)
    assert set(figures) == set(p.evidence["measured"])  # nothing still pending
    for key, value in figures.items():
        expected = value if isinstance(value, str) else pytest.approx(value, rel=5e-4)
        assert p.evidence["measured"][key] == expected, key
    assert all(r["n_layer"] == 48 for r in records) and (root / p.evidence["run_record"]).exists()
    assert p.evidence["measured"]["peak_device_bytes"] <= 24 * 2**30


def test_explicit_settings_that_agree_with_the_profile_are_accepted() -> None:
    p = load_profile("home-24g")
    s = resolve_launch(p, {"cache_slots": "150", "vram_budget_gib": 24.0, "draft_depth": None})
    assert s == p.launch


def test_each_contradicting_flag_is_listed_with_how_to_launch_unqualified() -> None:
    p = load_profile("home-24g")
    with pytest.raises(ProfileError) as err:
        resolve_launch(p, {"cache_slots": 64, "prefill_ubatch": 512, "server_ubatch": 512})
    msg = str(err.value)
    assert "contradict profile 'home-24g' (2 mismatches)" in msg
    assert "--cache-slots 64 (profile: 150)" in msg and "--prefill-ubatch 512 (profile: 2048)" in msg
    assert "--ubatch" not in msg and "--profile none" in msg


def test_profile_none_launches_unqualified_with_the_explicit_settings() -> None:
    assert load_profile("none") is None
    s = resolve_launch(None, {"cache_slots": "64", "vram_budget_gib": 12})
    assert s.cache_slots == 64 and s.vram_budget_gib == 12 and s.profile is None and s.prefill_ubatch == 2048


def test_bad_profiles_are_one_line_errors(tmp_path) -> None:
    with pytest.raises(ProfileError, match="no profile 'home-99g'.*known profiles: home-24g"):
        load_profile("home-99g")
    bad = tmp_path / "bad.toml"
    bad.write_text("[launch]\ncache_slots = 10\nturbo = true\n[evidence]\nqualified_on = 'x'\n")
    with pytest.raises(ProfileError, match="unknown \\[launch\\] settings turbo"):
        load_profile(bad)
    bad.write_text("[launch]\ncache_slots = 10\n")
    with pytest.raises(ProfileError, match="needs a \\[launch\\] and an \\[evidence\\] section"):
        load_profile(bad)
    bad.write_text("[launch]\ndrafter = 'mtp'\n[evidence]\nqualified_on = 'x'\n")
    with pytest.raises(ProfileError, match="--draft-depth 0 does not go with --draft mtp"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="unknown launch settings warp"):
        resolve_launch(None, {"warp": 9})
    bad.write_text("[launch]\nwarm_fill = 'gpu'\n[evidence]\nqualified_on = 'x'\n")
    with pytest.raises(ProfileError, match="--warm-fill must be 'host' or 'staging', got 'gpu'"):
        load_profile(bad)


def test_the_warm_fill_is_a_launch_setting_the_offload_config_takes() -> None:
    """home-24g fills warm slots from staging; --warm-fill host contradicts it; unqualified launches keep host
    unless told, and the offload config carries whichever was resolved."""
    from runner.offload.offload import offload_config

    p = load_profile("home-24g")
    assert offload_config(resolve_launch(p, {"warm_fill": None})).warm_fill == "staging"
    with pytest.raises(ProfileError, match="--warm-fill host \\(profile: staging\\)"):
        resolve_launch(p, {"warm_fill": "host"})
    assert offload_config(resolve_launch(None, {})).warm_fill == "host"
    assert offload_config(resolve_launch(None, {"warm_fill": "staging"})).warm_fill == "staging"
