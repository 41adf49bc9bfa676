"""Jobs in a real Jupyter kernel: `fit()` draws its logs into one updating output area (the
cell's outputs stay few however long the job), a TrainingJob renders as HTML (state,
attempts, metrics with a chart), and a kernel interrupt during `fit()` stops the job and
leaves no process."""

from __future__ import annotations

import time

import pytest

from tests.helpers import EXAMPLES, wait_no_leftovers
from trainctl.record.jobstore import JobStore

pytestmark = [pytest.mark.e2e, pytest.mark.kernel]

SETUP = f"""
from trainctl import Estimator
est = Estimator(
    entry_point="train.py", source_dir={str(EXAMPLES / "digits")!r}, instance_count=2,
    distribution={{"torch_distributed": {{"enabled": True}}}},
    hyperparameters={{"epochs": EPOCHS, "lr": 0.1, "seed": 0, "step-delay": STEP_DELAY}},
    job_name=JOB_NAME,
)
"""


@pytest.mark.timeout(240)
def test_fit_in_a_notebook_updates_one_output_and_renders_the_job(home, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("EPOCHS, STEP_DELAY, JOB_NAME = 3, 0.0, 'nb-fit'\n" + SETUP),
        nbformat.v4.new_code_cell("job = est.fit()\njob"),
        nbformat.v4.new_code_cell("est"),
    ]
    NotebookClient(notebook, timeout=200, kernel_name="python3").execute()
    nbformat.write(notebook, tmp_path / "fit.ipynb")  # kept with the test's files

    outputs = notebook.cells[1].outputs
    # one log area updated in place, a line per piece of work that took a while (packaging,
    # the upload), and the result: a handful, not a block per log line
    assert len(outputs) <= 6, [o.get("output_type") for o in outputs]
    texts = [o.get("data", {}).get("text/plain", "") or o.get("text", "") for o in outputs]
    assert all(t.strip() for t in texts), outputs  # no empty output
    assert not any("ipywidgets" in t or "Warning" in t for t in texts), texts
    logs = [t for t in texts if "[algo-" in t]
    assert len(logs) == 1 and "[algo-2]" in logs[0] and "Completed" in logs[0]
    shown = next(o for o in outputs if o.get("output_type") == "execute_result")
    page = shown["data"]["text/html"]
    assert "nb-fit" in page and "Completed" in page
    assert "<svg" in page and "loss=" in page  # the loss curve the script reports
    assert "<table>" in page and "outcome" in page  # the attempts
    # the cost row, as the docs promise, here that nothing was billed
    assert ">cost</th>" in page, page
    assert "none billed (this machine" in page, page
    assert "algo-1: nothing · algo-2: nothing" in page  # what each node restored: a first start
    # where its node-time went, in words and as a bar (one attempt)
    assert ">goodput</th>" in page and " % of " in page and page.count(">attempt 1<") == 1
    assert "training (goodput)" in page and "process start-up" in page
    assert "Estimator: train.py on 2 x local" in notebook.cells[2].outputs[0]["data"]["text/html"]


@pytest.mark.timeout(240)
def test_a_kernel_interrupt_during_fit_stops_the_job(home):
    from jupyter_client.manager import start_new_kernel

    from trainctl.store import default_store

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        client.execute("EPOCHS, STEP_DELAY, JOB_NAME = 200, 0.05, 'nb-interrupt'\n" + SETUP)
        reply = client.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        msg_id = client.execute("est.fit()")
        jobs = JobStore(default_store(), "nb-interrupt")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if jobs.exists() and jobs.load().state.value == "Training":
                break
            time.sleep(0.2)
        assert jobs.load().state.value == "Training"
        manager.interrupt_kernel()
        reply = None
        while reply is None or reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=120)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        record = jobs.load()
        assert record.state.value == "Stopped"
        assert record.stop_reason == "interrupted by the user (Ctrl-C)"
        assert wait_no_leftovers(timeout=30) == []
        # the kernel lives on (a request that reached it while it still handled the error
        # is "aborted", ipykernel's stop_on_error: the next one runs)
        statuses = []
        for _ in range(3):
            client.execute("1 + 1")
            statuses.append(client.get_shell_msg(timeout=30)["content"]["status"])
            if statuses[-1] != "aborted":
                break
        assert statuses[-1] == "ok", statuses
    finally:
        try:
            client.stop_channels()
        finally:
            manager.shutdown_kernel(now=True)
