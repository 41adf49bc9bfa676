"""The EC2 provider (boto3): see provider.py. Importing this package never imports boto3."""

from __future__ import annotations

from trainctl.provisioning.aws.provider import AwsProvider

__all__ = ["AwsProvider"]
