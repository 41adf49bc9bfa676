"""What a job with an image needs, checked before anything is uploaded or provisioned: an
engine where its nodes run (this machine for `local`), and a registry for an image built here
that other hosts must pull."""

from __future__ import annotations

from trainctl.errors import SpecError
from trainctl.spec.job import JobSpec
from trainctl.spec.settings import get_settings


def check_container_runtime(spec: JobSpec) -> None:
    """A job with an image needs an engine where its nodes run: on this machine for the
    local provider (checked now); on each host for ssh and EC2 (checked there when it is
    provisioned, with the image pulled). An image built here reaches remote hosts only
    through a registry."""
    from trainctl.image.engine import find_engine

    # the field that asked for the image
    field = "image_uri" if spec.image_uri else "build_image" if spec.build_image else ""
    field = field or "framework_version"
    if spec.provider in ("ssh", "aws"):
        if spec.builds_image and not get_settings().image_repository:
            raise SpecError(
                field,
                f"{spec.provider} hosts pull the job's image, built here, from a registry: set "
                "image_repository (TRAINCTL_IMAGE_REPOSITORY) to one they can reach, or build "
                "and push it yourself (`trainctl build --push REPO`) and give image_uri",
            )
        if not spec.builds_image:
            return  # each host's engine is checked (and the image pulled) at provision

    if find_engine() is None:
        raise SpecError(
            field,
            "running in a container image needs docker or podman on this machine and none "
            "is installed and answering; install one, or leave image_uri unset to run the "
            "entry point as processes",
        )
