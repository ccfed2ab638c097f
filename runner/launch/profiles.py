"""Launch profiles: a qualified launch configuration (TOML [launch]) plus the evidence that qualified it.

`load_profile("home-24g")` reads profiles/home-24g.toml (or any .toml path); `resolve_launch` merges
the settings given explicitly on the command line: one that contradicts the profile is refused,
every mismatch listed, with how to launch unqualified on purpose (`--profile none`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from runner.errors import ProfileError
from runner.package_data import profile_dir

NO_PROFILE = "none"
PROFILE_MAX_BYTES = 1 << 20  # a profile is a few dozen lines; anything larger is not one
# 1 MiB (below it the budget rounds to no bytes at all) to 1 PiB (no card comes near; the byte count stays an int64).
VRAM_BUDGET_GIB_RANGE = (1 / 1024, 2.0**20)


def check_vram_budget(gib: Any, error: type[Exception] = ProfileError) -> None:
    """Refuse a --vram-budget (or a profile's vram_budget_gib) that is not a number of GiB from 1 MiB to 1 PiB."""
    low, high = VRAM_BUDGET_GIB_RANGE
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not low <= gib <= high:  # nan fails too
        raise error(f"--vram-budget must be a positive number of GiB, 1/1024 (1 MiB) to {high:.0f} (1 PiB), "
                    f"got {gib!r}")


@dataclass(frozen=True)
class LaunchSettings:
    vram_budget_gib: float | None = None  # None: the card's free memory
    server_ubatch: int = 512
    prefill_ubatch: int = 2048
    cache_slots: int | str = "auto"  # per MoE layer, or "auto"
    drafter: str = "none"  # "mtp" or "none"
    draft_depth: int = 0
    warm_fill: str = "host"  # "staging": a prompt's warm slots copied device to device from its staging buffers
    profile: str | None = None  # the profile these settings were qualified by, None when unqualified

    def __post_init__(self) -> None:
        if isinstance(self.cache_slots, str) and self.cache_slots.strip().isdigit():
            object.__setattr__(self, "cache_slots", int(self.cache_slots))  # "150" from a command line
        # Every type is checked here: a profile is a file anyone may hand over (TOML has strings, bools, inf, nan).
        for name in ("server_ubatch", "prefill_ubatch"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ProfileError(f"{FLAGS[name]} must be a positive integer, got {getattr(self, name)!r}")
        if not (self.cache_slots == "auto" or (_is_int(self.cache_slots) and self.cache_slots >= 1)):
            raise ProfileError(f"--cache-slots must be a positive integer or 'auto', got {self.cache_slots!r}")
        if self.vram_budget_gib is not None:
            check_vram_budget(self.vram_budget_gib)
        if self.warm_fill not in ("host", "staging"):
            raise ProfileError(f"--warm-fill must be 'host' or 'staging', got {self.warm_fill!r}")
        if self.drafter not in ("mtp", "none"):
            raise ProfileError(f"--draft must be 'mtp' or 'none', got {self.drafter!r}")
        if not _is_int(self.draft_depth):
            raise ProfileError(f"--draft-depth must be an integer, got {self.draft_depth!r}")
        if self.draft_depth < 0 or (self.drafter == "none") != (self.draft_depth == 0):
            raise ProfileError(f"--draft-depth {self.draft_depth} does not go with --draft {self.drafter}")


# The command-line flag of each setting, for messages.
FLAGS = {"vram_budget_gib": "--vram-budget", "server_ubatch": "--ubatch", "prefill_ubatch": "--prefill-ubatch",
         "cache_slots": "--cache-slots", "drafter": "--draft", "draft_depth": "--draft-depth",
         "warm_fill": "--warm-fill"}


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    launch: LaunchSettings
    evidence: dict[str, Any]
    description: str = ""


def load_profile(name_or_path: str | Path) -> Profile | None:
    """A profile by name (profiles/NAME.toml) or path; None for `none` (launch unqualified)."""
    text = str(name_or_path)
    if text.lower() == NO_PROFILE:
        return None
    shipped = profile_dir()
    by_name = shipped / f"{text}.toml" if shipped is not None else Path(f"{text}.toml")
    path = Path(text) if text.endswith(".toml") or Path(text).is_file() else by_name
    if not path.is_file():  # a directory, a FIFO or a device is no profile either
        known = ", ".join(sorted(p.stem for p in shipped.glob("*.toml"))) if shipped is not None else ""
        known = known or "none found"
        raise ProfileError(f"no profile '{text}' ({path}); known profiles: {known}; or --profile none")
    try:
        with path.open("rb") as f:
            raw = f.read(PROFILE_MAX_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"cannot read the profile {path}: {exc.strerror or exc}") from None
    if len(raw) > PROFILE_MAX_BYTES:
        raise ProfileError(f"{path}: larger than the {PROFILE_MAX_BYTES >> 20} MiB a profile may have")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not a TOML profile (not UTF-8 text: {exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    launch, evidence, about = data.get("launch"), data.get("evidence"), data.get("profile", {})
    if not isinstance(launch, dict) or not isinstance(evidence, dict):
        raise ProfileError(f"{path}: a profile needs a [launch] and an [evidence] section")
    if not isinstance(about, dict) or not all(isinstance(about.get(k, ""), str) for k in ("name", "description")):
        raise ProfileError(f"{path}: [profile] must be a table whose name and description are strings")
    if "qualified_on" not in evidence:
        raise ProfileError(f"{path}: [evidence] must say what the profile was qualified on (qualified_on)")
    unknown = sorted(set(launch) - set(FLAGS))
    if unknown:
        raise ProfileError(f"{path}: unknown [launch] settings {', '.join(unknown)}; known: {', '.join(FLAGS)}")
    name = about.get("name", path.stem)
    settings = LaunchSettings(**launch, profile=name)
    return Profile(name, path, settings, evidence, about.get("description", ""))


def resolve_launch(profile: Profile | None, explicit: Mapping[str, Any]) -> LaunchSettings:
    """The settings to launch with: the profile's, with explicit ones (None: not given) that agree.

    Without a profile the explicit settings apply over the defaults, unqualified.
    """
    unknown = sorted(set(explicit) - set(FLAGS))
    if unknown:
        raise ProfileError(f"unknown launch settings {', '.join(unknown)}")
    given = {k: v for k, v in explicit.items() if v is not None}
    if profile is None:
        return replace(LaunchSettings(), **given)
    base = profile.launch
    mismatches = [(k, v, getattr(base, k)) for k, v in given.items() if not _same(v, getattr(base, k))]
    if mismatches:
        lines = "; ".join(f"{FLAGS[k]} {v} (profile: {p})" for k, v, p in mismatches)
        raise ProfileError(
            f"the explicit settings contradict profile '{profile.name}' ({len(mismatches)} mismatch"
            f"{'es' if len(mismatches) > 1 else ''}): {lines}. Drop those flags to launch as qualified, "
            f"or pass --profile none to launch unqualified on purpose"
        )
    return base


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # TOML's true is no slot count


def _same(given: Any, profiled: Any) -> bool:
    if isinstance(given, (int, float)) and isinstance(profiled, (int, float)) and not isinstance(given, bool):
        return float(given) == float(profiled)
    return str(given).lower() == str(profiled).lower()
