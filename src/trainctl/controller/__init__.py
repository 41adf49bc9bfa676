"""The job controller: state machine, lease, log multiplexing, teardown."""
