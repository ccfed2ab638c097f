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


@dataclass(frozen=True)
class LaunchSettings:
    vram_budget_gib: float | None = None  # None: the card's free memory
    server_ubatch: int = 512
    prefill_ubatch: int = 2048
    cache_slots: int | str = "auto"  # per MoE layer, or "auto"
    drafter: str = "none"  # "mtp" or "none"
    draft_depth: int = 0
    profile: str | None = None  # the profile these settings were qualified by, None when unqualified

    def __post_init__(self) -> None:
        if isinstance(self.cache_slots, str) and self.cache_slots.strip().isdigit():
            object.__setattr__(self, "cache_slots", int(self.cache_slots))  # "150" from a command line
        for name in ("server_ubatch", "prefill_ubatch"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ProfileError(f"{FLAGS[name]} must be a positive integer, got {getattr(self, name)!r}")
        if not (self.cache_slots == "auto" or (isinstance(self.cache_slots, int) and self.cache_slots >= 1)):
            raise ProfileError(f"--cache-slots must be a positive integer or 'auto', got {self.cache_slots!r}")
        if self.vram_budget_gib is not None and not self.vram_budget_gib > 0:
            raise ProfileError(f"--vram-budget must be a positive number of GiB, got {self.vram_budget_gib!r}")
        if self.drafter not in ("mtp", "none"):
            raise ProfileError(f"--draft must be 'mtp' or 'none', got {self.drafter!r}")
        if self.draft_depth < 0 or (self.drafter == "none") != (self.draft_depth == 0):
            raise ProfileError(f"--draft-depth {self.draft_depth} does not go with --draft {self.drafter}")


# The command-line flag of each setting, for messages.
FLAGS = {"vram_budget_gib": "--vram-budget", "server_ubatch": "--ubatch", "prefill_ubatch": "--prefill-ubatch",
         "cache_slots": "--cache-slots", "drafter": "--draft", "draft_depth": "--draft-depth"}


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
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in shipped.glob("*.toml"))) if shipped is not None else ""
        known = known or "none found"
        raise ProfileError(f"no profile '{text}' ({path}); known profiles: {known}; or --profile none")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    launch, evidence = data.get("launch"), data.get("evidence")
    if not isinstance(launch, dict) or not isinstance(evidence, dict):
        raise ProfileError(f"{path}: a profile needs a [launch] and an [evidence] section")
    if "qualified_on" not in evidence:
        raise ProfileError(f"{path}: [evidence] must say what the profile was qualified on (qualified_on)")
    unknown = sorted(set(launch) - set(FLAGS))
    if unknown:
        raise ProfileError(f"{path}: unknown [launch] settings {', '.join(unknown)}; known: {', '.join(FLAGS)}")
    name = str(data.get("profile", {}).get("name", path.stem))
    settings = LaunchSettings(**launch, profile=name)
    return Profile(name, path, settings, evidence, str(data.get("profile", {}).get("description", "")))


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


def _same(given: Any, profiled: Any) -> bool:
    if isinstance(given, (int, float)) and isinstance(profiled, (int, float)) and not isinstance(given, bool):
        return float(given) == float(profiled)
    return str(given).lower() == str(profiled).lower()
