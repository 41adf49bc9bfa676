"""`sagemaker.local.LocalSession`: trainctl's Session (a local-mode notebook's
`instance_type="local"` runs on this machine through the local provider)."""

from trainctl.sagemaker.session import Session


class LocalSession(Session):
    """SageMaker's local-mode session; `config` (`{'local': {'local_code': True}}`) has
    nothing to act on: the source is always packaged from your disk."""

    def __init__(self, boto_session=None, default_bucket=None, s3_endpoint_url=None, **kwargs):
        super().__init__(boto_session=boto_session, default_bucket=default_bucket, **kwargs)


__all__ = ["LocalSession"]
