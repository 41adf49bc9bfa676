"""`smdistributed.dataparallel.torch`: `torch_smddp` (the `smddp` backend, today's API) and
`distributed` / `parallel.distributed` (the older API with its own DistributedDataParallel)."""
