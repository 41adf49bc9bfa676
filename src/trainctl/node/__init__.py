"""What runs on a node: the agent, checkpoint sync, spot notices (IMDS), the per-job
Python environment and the node's processes. Imports no client-side package.
"""
