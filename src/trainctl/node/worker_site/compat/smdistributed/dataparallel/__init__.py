"""SageMaker's data-parallel library (smddp), as torch.distributed: see torch/."""
