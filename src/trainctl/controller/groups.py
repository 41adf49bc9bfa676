"""Whether the ranks of a multi-node job trained together.

A script run under torchrun on several nodes that never forms a process group across them
still runs, and each node trains a model of its own: Lightning with its default
`Trainer(num_nodes=1)` does this (it takes one node's ranks for the whole world), as does a
script that only calls `init_process_group` when its own setting says so; a Hugging Face
Trainer on CPU without `use_cpu` forms a group across them and then trains through none of
it (barriers only). Nothing fails; the job Completes with N different models. Each node's
agent says what process groups its ranks formed and whether one trained through a group
(node.ranks, from the worker hook); the controller says once when none did across the nodes.
"""

from __future__ import annotations

from typing import Any

from trainctl.cluster import ClusterInfo


def trained_apart(cluster: ClusterInfo, results: list[dict[str, Any]]) -> str | None:
    """The warning for an attempt whose nodes trained each on its own; None when a group
    spanned nodes, or when it cannot be told (one node, a node without the hook's report)."""
    nodes = len(cluster.nodes)
    reports = [r.get("groups") for r in results]
    if nodes < 2 or len(reports) < nodes:
        return None
    if any(r.get("exit_code") != 0 for r in results):
        return None  # a script that failed (before its group, say) did not train apart
    if not all(isinstance(g, dict) and isinstance(g.get("ranks"), int) for g in reports):
        return None
    if any(g["ranks"] == 0 for g in reports):  # the hook did not run there (no site, say)
        return None
    largest = max(int(g.get("largest") or 0) for g in reports)
    per_node = cluster.processes_per_host
    world = nodes * per_node
    if largest > per_node:
        # Formed across the nodes; trained through it? (An agent too old to say: yes.)
        if any(g.get("used", True) for g in reports):
            return None
        return (
            f"the {nodes} nodes never trained together: their ranks formed a process group "
            f"of {largest} across them but none trained through it (no DistributedDataParallel,"
            " FSDP or tensor collective; only barriers), so each node trained a model of its "
            "own. For a Hugging Face Trainer on CPU: TrainingArguments(use_cpu=True), which "
            "makes it DISTRIBUTED; a script of your own: wrap the model in "
            "DistributedDataParallel"
        )
    formed = (
        "no rank formed a process group"
        if largest == 0
        else f"the largest process group had {largest} rank(s), one node's"
    )
    return (
        f"the {nodes} nodes never trained together: {formed} (torchrun gave the ranks "
        f"WORLD_SIZE={world}), so each node trained a model of its own. The script's own "
        f"setting usually decides: for Lightning, Trainer(num_nodes={nodes}); for a script "
        "that starts its own process group, its world size"
    )
