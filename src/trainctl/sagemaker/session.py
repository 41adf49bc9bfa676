"""`sagemaker.Session` and `get_execution_role` on trainctl: the default bucket is the store.

A SageMaker notebook's first cell works unchanged but for its imports:

    sess = sagemaker.Session()
    bucket = sess.default_bucket()          # S3 store s3://B/...: B; a file store: LOCAL_BUCKET
    role = sagemaker.get_execution_role()   # the configured instance profile, or a placeholder
    inputs = sess.upload_data("data", bucket=bucket, key_prefix="sagemaker/mnist")

On an S3 store, buckets and keys are S3's own, as on SageMaker. On a file store (the local
default), the default bucket is a directory of the store (`<store>/bucket/`), named
LOCAL_BUCKET: `s3://<LOCAL_BUCKET>/key` in any argument of the shim (an input, output_path,
checkpoint_s3_uri) means that directory's `key`, so URIs a notebook builds from the bucket
name (`f"s3://{bucket}/{prefix}/output"`) work there too. Another bucket name is S3's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from trainctl.errors import SpecError
from trainctl.sagemaker._compat import warn

# The default bucket's name when the store is a directory.
LOCAL_BUCKET = "trainctl-local-bucket"
# Where that bucket lives in a file store.
LOCAL_BUCKET_DIR = "bucket"
# What get_execution_role() returns when no instance profile is configured: the local
# provider needs none; an EC2 job is told once that it has none.
PLACEHOLDER_ACCOUNT = "000000000000"
ROLE_PLACEHOLDER = (
    f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:role/trainctl-no-instance-profile-configured"
)


class Session:
    """SageMaker's Session: its default bucket, uploads and downloads are the store's."""

    def __init__(
        self,
        boto_session: Any = None,
        sagemaker_client: Any = None,
        sagemaker_runtime_client: Any = None,
        sagemaker_featurestore_runtime_client: Any = None,
        default_bucket: str | None = None,
        settings: Any = None,
        sagemaker_metrics_client: Any = None,
        sagemaker_config: dict | None = None,
        default_bucket_prefix: str | None = None,
    ) -> None:
        from trainctl.store import default_store

        self.store = default_store()
        self._boto_session = boto_session
        self._default_bucket = default_bucket
        self.default_bucket_prefix = (default_bucket_prefix or "").strip("/") or None
        self.sagemaker_config = sagemaker_config
        self.config: dict | None = None  # LocalSession's {'local': {...}}: nothing to act on
        # SageMaker API clients: nothing here calls SageMaker.
        self.sagemaker_client = sagemaker_client
        self.sagemaker_runtime_client = sagemaker_runtime_client
        self.settings = settings

    # -- where things are ---------------------------------------------------------------
    @property
    def local_store(self) -> bool:
        return not self.store.uri.startswith("s3://")

    def default_bucket(self) -> str:
        """The store's bucket (an S3 store), or LOCAL_BUCKET (a file store)."""
        if self._default_bucket:
            return self._default_bucket
        if self.local_store:
            return LOCAL_BUCKET
        return self.store.uri[len("s3://") :].split("/", 1)[0]

    @property
    def boto_region_name(self) -> str:
        """The AWS region of your configuration (us-east-1 when none is configured)."""
        if self._boto_session is not None and getattr(self._boto_session, "region_name", None):
            return str(self._boto_session.region_name)
        try:
            from trainctl.provisioning.aws.clients import configured_region

            return configured_region() or "us-east-1"
        except ImportError:  # no boto3: nothing to configure a region with
            return "us-east-1"

    def account_id(self) -> str:
        """The AWS account (STS) of an S3 store; on a file store nothing is AWS's, and it is
        ROLE_PLACEHOLDER's account, 000000000000 (what a notebook builds into an ARN or an
        image URI stays well-formed)."""
        if self.local_store:
            return PLACEHOLDER_ACCOUNT
        return str(self.boto_session.client("sts").get_caller_identity()["Account"])

    @property
    def boto_session(self) -> Any:
        if self._boto_session is None:
            import boto3

            self._boto_session = boto3.Session(region_name=self.boto_region_name)
        return self._boto_session

    def uri(self, bucket: str | None, key: str) -> str:
        """The URI of `key` in `bucket` (None: the default bucket): a directory of the
        store for LOCAL_BUCKET on a file store, else S3's."""
        bucket = bucket or self.default_bucket()
        key = key.strip("/")
        if bucket == LOCAL_BUCKET and self.local_store:
            # a directory of its own: no key reaches the store's records (jobs/, sources/)
            base = self.store.url(LOCAL_BUCKET_DIR)
            return f"{base}/{key}" if key else base
        return f"s3://{bucket}/{key}" if key else f"s3://{bucket}"

    def resolve(self, uri: str) -> str:
        """A URI as trainctl opens it: s3://<LOCAL_BUCKET>/key on a file store is the
        store's directory; every other URI is itself."""
        prefix = f"s3://{LOCAL_BUCKET}"
        if self.local_store and (uri == prefix or uri.startswith(prefix + "/")):
            return self.uri(LOCAL_BUCKET, uri[len(prefix) :])
        return uri

    def _with_default_prefix(self, bucket: str | None, key: str) -> str:
        if bucket is None and self.default_bucket_prefix:
            return f"{self.default_bucket_prefix}/{key.strip('/')}"
        return key

    # -- data ---------------------------------------------------------------------------
    def upload_data(
        self,
        path: str,
        bucket: str | None = None,
        key_prefix: str = "data",
        callback: Any = None,
        extra_args: dict | None = None,
    ) -> str:
        """Upload a file or a directory (recursively); returns its URI: the prefix of a
        directory, the object of a file (as SageMaker's)."""
        from trainctl.store import open_store

        source = Path(path)
        if not source.exists():
            raise SpecError("path", f"{path} does not exist")
        key_prefix = self._with_default_prefix(bucket, key_prefix)
        base = self.uri(bucket, key_prefix)
        store = open_store(base, field="bucket")
        if source.is_dir():
            files = sorted(p for p in source.rglob("*") if p.is_file())
            store.put_files([(p.relative_to(source).as_posix(), p) for p in files])
            return base
        store.put_file(source.name, source)
        return f"{base}/{source.name}"

    def upload_string_as_file_body(
        self, body: str, bucket: str, key: str, kms_key: str | None = None
    ) -> str:
        from trainctl.store import open_store

        uri = self.uri(bucket, key)
        parent, _, leaf = uri.rpartition("/")
        open_store(parent, field="bucket").put_text(leaf, body)
        return uri

    def download_data(
        self, path: str, bucket: str, key_prefix: str = "", extra_args: dict | None = None
    ) -> list[str]:
        """Download the objects under `key_prefix` into `path` (relative to the prefix, or by
        their file name when the prefix names one object); returns the local paths."""
        from trainctl.store import open_store

        keys = self.list_s3_files(bucket, key_prefix)
        bucket_store = open_store(self.uri(bucket, ""), field="bucket")
        target = Path(path).resolve()
        single = bool(Path(key_prefix).suffix)
        downloaded = []
        for key in keys:
            rel = Path(key).name if single else Path(key).relative_to(key_prefix.strip("/"))
            dest = (target / rel).resolve()
            if not dest.is_relative_to(target):
                raise SpecError("key_prefix", f"{key!r} would land outside {path}")
            bucket_store.get_file(key, dest)
            downloaded.append(str(dest))
        return downloaded

    def list_s3_files(self, bucket: str, key_prefix: str) -> list[str]:
        """The keys under `key_prefix` (the object itself when it names one)."""
        from trainctl.store import open_store

        bucket_store = open_store(self.uri(bucket, ""), field="bucket")
        prefix = key_prefix.strip("/")
        keys = [i.key for i in bucket_store.list(prefix)]
        if prefix and not keys and bucket_store.exists(prefix):
            keys = [prefix]
        return keys

    def read_s3_file(self, bucket: str, key_prefix: str) -> str:
        from trainctl.store import open_store

        return open_store(self.uri(bucket, ""), field="bucket").get_text(key_prefix.strip("/"))

    # -- jobs ---------------------------------------------------------------------------
    def describe_training_job(self, job_name: str) -> dict[str, Any]:
        from trainctl.sagemaker.job import SageMakerTrainingJob

        return SageMakerTrainingJob.attach(job_name, self.store.uri).describe()

    def logs_for_job(
        self,
        job_name: str,
        wait: bool = False,
        poll: int = 10,
        log_type: str = "All",
        timeout: int | None = None,
    ) -> None:
        from trainctl.estimator import TrainingJob

        TrainingJob.attach(job_name, self.store.uri).logs(follow=wait, stream=sys.stdout)

    def wait_for_job(self, job: str, poll: int = 5) -> dict[str, Any]:
        from trainctl.estimator import TrainingJob

        handle = TrainingJob.attach(job, self.store.uri)
        handle.wait(raise_on_failure=False)
        return self.describe_training_job(job)

    def get_caller_identity_arn(self) -> str:
        return get_execution_role(self)


def get_execution_role(sagemaker_session: Session | None = None, use_default: bool = False) -> str:
    """The role a SageMaker notebook passes to its estimator: here the instance profile of
    EC2 nodes (the `instance_profile` setting, TRAINCTL_INSTANCE_PROFILE), or, when none is
    configured, ROLE_PLACEHOLDER: the local provider needs no role, and an EC2 job gets one
    warning that it has no instance profile."""
    from trainctl.spec.settings import get_settings

    return get_settings().instance_profile or ROLE_PLACEHOLDER


def warn_placeholder_role() -> None:
    warn(
        "role",
        "no instance profile is configured (get_execution_role() returned a placeholder): "
        "set instance_profile in ~/.trainctl/config.yaml or TRAINCTL_INSTANCE_PROFILE, or "
        "pass role= an instance profile; EC2 nodes reach the store with its role",
        stacklevel=5,
    )
