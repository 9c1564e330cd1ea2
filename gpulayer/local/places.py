"""Where the local workers say they are: zones and regions by the cloud naming convention.

So the README's examples (zones, regions, a 2-worker gang in one region) place on a laptop as they
would on a cluster.
"""

from __future__ import annotations

# Worker i takes DEFAULT_ZONES[i], round again.
DEFAULT_ZONES = ("europe-west1-b", "europe-west1-c", "europe-west1-d")


def region_of(zone: str) -> str:
    """A zone's region by the cloud naming convention: ``europe-west1-b`` -> ``europe-west1``."""
    head, sep, tail = zone.rpartition("-")
    return head if sep and head and len(tail) == 1 else zone


def worker_places(workers: int, zones: list[str] | None = None,
                  regions: list[str] | None = None) -> list[tuple[str, str]]:
    """(zone, region) of each local worker: ``zones`` / ``regions`` taken in turn (round again when there
    are more workers than names); zones default to ``DEFAULT_ZONES``, a region to its zone's (``region_of``)."""
    zones = list(zones or DEFAULT_ZONES)
    places = []
    for i in range(workers):
        zone = zones[i % len(zones)]
        places.append((zone, regions[i % len(regions)] if regions else region_of(zone)))
    return places
