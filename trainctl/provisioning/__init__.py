"""Capacity providers behind one small interface; one module per provider."""

from __future__ import annotations

from trainctl.errors import SpecError
from trainctl.provisioning.base import Provider
from trainctl.provisioning.catalog import CATALOG


def get_provider(instance_type: str) -> Provider:
    """The provider for an instance type, or a SpecError if it is not available yet."""
    kind = CATALOG[instance_type].provider
    if kind == "local":
        from trainctl.provisioning.local import LocalProvider

        return LocalProvider()
    raise SpecError(
        "instance_type",
        f"{instance_type!r} needs the {kind!r} provider, which this version of trainctl "
        "does not have yet; use instance_type='local'",
    )
