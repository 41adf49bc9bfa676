"""`sagemaker.s3.S3Uploader` / `S3Downloader` on the store (see trainctl.sagemaker.session:
s3://<default bucket>/... on a file store is a directory of the store)."""

from __future__ import annotations

from typing import Any

from trainctl.errors import SpecError
from trainctl.sagemaker.session import Session


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise SpecError("s3_uri", f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


class S3Uploader:
    @staticmethod
    def upload(
        local_path: str,
        desired_s3_uri: str,
        kms_key: str | None = None,
        sagemaker_session: Session | None = None,
        callback: Any = None,
        extra_args: dict | None = None,
    ) -> str:
        session = sagemaker_session or Session()
        bucket, key = _split(desired_s3_uri)
        return session.upload_data(local_path, bucket=bucket, key_prefix=key)

    @staticmethod
    def upload_string_as_file_body(
        body: str,
        desired_s3_uri: str,
        kms_key: str | None = None,
        sagemaker_session: Session | None = None,
    ) -> str:
        session = sagemaker_session or Session()
        bucket, key = _split(desired_s3_uri)
        return session.upload_string_as_file_body(body, bucket, key)


class S3Downloader:
    @staticmethod
    def download(
        s3_uri: str,
        local_path: str,
        kms_key: str | None = None,
        sagemaker_session: Session | None = None,
    ) -> list[str]:
        session = sagemaker_session or Session()
        bucket, key = _split(s3_uri)
        return session.download_data(local_path, bucket, key)

    @staticmethod
    def read_file(s3_uri: str, sagemaker_session: Session | None = None) -> str:
        session = sagemaker_session or Session()
        bucket, key = _split(s3_uri)
        return session.read_s3_file(bucket, key)

    @staticmethod
    def list(s3_uri: str, sagemaker_session: Session | None = None) -> list[str]:
        """The URIs of the objects under `s3_uri`, as SageMaker lists them."""
        session = sagemaker_session or Session()
        bucket, key = _split(s3_uri)
        return [f"s3://{bucket}/{k}" for k in session.list_s3_files(bucket, key)]
