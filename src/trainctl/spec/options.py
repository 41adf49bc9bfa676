"""The per-provider option blocks of a job (`aws`, `ssh`): views of flat JobSpec fields that
only one provider reads. Apart from trainctl.spec.request so that the job spec can make
them without importing the request, which is made from the job spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from trainctl.spec.capacity import SshHost


class View(BaseModel):
    """A frozen view of some JobSpec fields (same names, same types)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AwsOptions(View):
    """What only EC2 reads: the nodes' AMI, instance profile, network and root volume."""

    image_id: str | None = None
    instance_profile: str | None = None
    subnets: list[str] = []
    security_group_ids: list[str] = []
    volume_size: int | None = None
    volume_kms_key: str | None = None
    tags: dict[str, str] = {}

    @property
    def root_volume_gb(self) -> int:
        from trainctl.spec.limits import DEFAULT_VOLUME_GB

        return self.volume_size or DEFAULT_VOLUME_GB


class SshOptions(View):
    """What only the SSH provider reads: the hosts it places nodes on, in rank order."""

    hosts: list[SshHost] = []
