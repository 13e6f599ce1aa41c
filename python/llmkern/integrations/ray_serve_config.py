"""Checks of what build_app hands to Ray Serve, so that a bad setting fails at build time with the
field named (Ray would otherwise fail later, inside its controller, or not at all)."""
from __future__ import annotations

from typing import Optional


def _int(cfg: dict, key: str, lo: int) -> Optional[int]:
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"autoscaling_config.{key}: expected an integer >= {lo}, got {v!r}")
    return v


def check_autoscaling(cfg: Optional[dict]) -> Optional[dict]:
    """A copy of `cfg` (Ray Serve's autoscaling_config, keys as Ray spells them) once it is valid;
    ValueError naming the field otherwise. None: a fixed number of replicas."""
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise ValueError(f"autoscaling_config: expected a dict (min_replicas, max_replicas, "
                         f"target_ongoing_requests, ...), got {type(cfg).__name__}")
    from ray.serve.config import AutoscalingConfig

    known = set(getattr(AutoscalingConfig, "model_fields", None) or AutoscalingConfig.__fields__)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"autoscaling_config.{unknown[0]}: not a Ray Serve autoscaling field "
                         f"(known: {', '.join(sorted(known))})")
    lo = _int(cfg, "min_replicas", 0)
    hi = _int(cfg, "max_replicas", 1)
    if lo is not None and hi is not None and hi < lo:
        raise ValueError(f"autoscaling_config.max_replicas: {hi} is below min_replicas {lo}")
    target = cfg.get("target_ongoing_requests")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0):
        raise ValueError(f"autoscaling_config.target_ongoing_requests: expected a number > 0, got {target!r}")
    try:   # the remaining fields (delays, factors, windows): Ray's own model names the field
        AutoscalingConfig(**cfg)
    except Exception as e:  # noqa: BLE001 - pydantic's error type differs between its versions
        errs = getattr(e, "errors", None)
        loc = ".".join(str(x) for x in (errs()[0].get("loc") or ())) if callable(errs) and errs() else ""
        raise ValueError(f"autoscaling_config{'.' + loc if loc else ''}: {e}") from None
    return dict(cfg)
