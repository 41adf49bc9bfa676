"""trainctl's stand-in for SageMaker's distributed training libraries, importable in a job's
processes where the real `smdistributed` is not installed (it ships only in SageMaker's
images): the data-parallel library's API over torch.distributed, so a script written for it
runs unchanged. The model-parallel library (SMP) has no stand-in: a job asking for it is
refused at submit."""
