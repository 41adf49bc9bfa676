"""Replays of a job against a spot market, through the real controller.

The controller (trainctl.controller), its store code and its cost accounting run as they
do for a real job; the clock is simulated (trainctl.clock.VirtualClock), so hours of a job
replay in seconds; the capacity follows a spot trace (trainctl.spec.trace) or a pool with
faults (`market`); the nodes are stand-ins in this process that speak the agent's protocol
(`fleet`) and train by a throughput model (`training`). `strategies` runs one job under the
strategies trainctl offers, side by side: what `trainctl estimate` prints and
bench/spot.py measures at scale.
"""
