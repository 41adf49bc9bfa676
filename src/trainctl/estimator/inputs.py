"""Input channels as `fit()` takes them: a URI, or a `TrainingInput` (SageMaker's class,
with the same arguments) that also says how the channel is distributed over the nodes.

Arguments SageMaker accepts and trainctl cannot honour are refused in one line naming the
argument; none is silently dropped.
"""

from __future__ import annotations

from typing import Any

from trainctl.errors import SpecError

DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")


class TrainingInput:
    """One input channel: `s3_data` (an s3:// or file:// URI), its `distribution`:
    FullyReplicated (every node gets all of it) or ShardedByS3Key (each of N nodes gets
    every N-th object, in key order), and its `input_mode`: File (the default: the script
    gets a copy) or FastFile (a file:// channel is linked, not copied)."""

    def __init__(
        self,
        s3_data: str,
        distribution: str | None = None,
        compression: str | None = None,
        content_type: str | None = None,
        record_wrapping: str | None = None,
        s3_data_type: str = "S3Prefix",
        instance_groups: list[str] | None = None,
        input_mode: str | None = None,
        attribute_names: list[str] | None = None,
        target_attribute_name: str | None = None,
        shuffle_config: Any = None,
    ) -> None:
        if not isinstance(s3_data, str) or not s3_data:
            raise SpecError("TrainingInput.s3_data", "must be an s3:// or file:// URI")
        distribution = distribution or "FullyReplicated"
        if distribution not in DISTRIBUTIONS:
            raise SpecError(
                "TrainingInput.distribution",
                f"{distribution!r} is not a distribution: use {' or '.join(DISTRIBUTIONS)}",
            )
        refused = {
            "compression": (compression not in (None, "None"), "channels are staged as files"),
            "record_wrapping": (record_wrapping is not None, "no RecordIO wrapping"),
            "s3_data_type": (s3_data_type != "S3Prefix", "only S3Prefix (manifests: not yet)"),
            "instance_groups": (bool(instance_groups), "no heterogeneous clusters"),
            "input_mode": (
                input_mode not in (None, "File", "FastFile"),
                "File (a copy of the channel) or FastFile (a link to it); no Pipe mode",
            ),
            "attribute_names": (bool(attribute_names), "no augmented manifests"),
            "target_attribute_name": (target_attribute_name is not None, "no such input"),
            "shuffle_config": (shuffle_config is not None, "objects are staged in key order"),
        }
        for name, (given, why) in refused.items():
            if given:
                raise SpecError(f"TrainingInput.{name}", f"not supported by trainctl: {why}")
        self.s3_data = s3_data
        self.distribution = distribution
        self.content_type = content_type
        self.input_mode = input_mode or "File"
        self.config: dict[str, Any] = {"distribution": distribution}
        if content_type:
            self.config["content_type"] = content_type
        if self.input_mode != "File":
            self.config["input_mode"] = self.input_mode

    def __repr__(self) -> str:
        return f"TrainingInput({self.s3_data!r}, distribution={self.distribution!r})"


def split_inputs(
    inputs: str | TrainingInput | dict[str, str | TrainingInput] | None,
) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """(channel -> URI, channel -> channel_config) from what `fit()` was given: a URI or a
    TrainingInput (the channel 'training'), or a dict of either per channel."""
    if inputs is None:
        return {}, {}
    if isinstance(inputs, str | TrainingInput):
        inputs = {"training": inputs}
    if not isinstance(inputs, dict):
        raise SpecError(
            "inputs", "must be a URI, a TrainingInput, or a {channel: URI or TrainingInput} dict"
        )
    uris: dict[str, str] = {}
    configs: dict[str, dict[str, Any]] = {}
    for channel, value in inputs.items():
        if isinstance(value, TrainingInput):
            uris[channel] = value.s3_data
            if value.config != {"distribution": "FullyReplicated"}:
                configs[channel] = dict(value.config)
        elif isinstance(value, str):
            uris[channel] = value
        else:
            raise SpecError(f"inputs.{channel}", "must be a URI string or a TrainingInput")
    return uris, configs
