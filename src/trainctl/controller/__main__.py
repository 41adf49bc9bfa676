"""Controllers as processes of their own.

python -m trainctl.controller --store URI JOB      one job's detached controller
python -m trainctl.controller serve --store URI --id ID [--idle-seconds S]
                                                   a service for every job assigned to ID
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    parser = argparse.ArgumentParser(prog="trainctl-controller")
    parser.add_argument("--store", required=True)
    parser.add_argument("job")
    args = parser.parse_args(argv)

    from trainctl.controller.controller import Controller
    from trainctl.controller.detached import file_controller_log
    from trainctl.controller.logs import LogPrinter
    from trainctl.store import open_store

    store = open_store(args.store)
    controller = Controller(store, args.job, printer=LogPrinter(sys.stdout, colour=False))
    record = controller.run()
    try:
        file_controller_log(store, args.job)
    except Exception as exc:  # it stays on this machine: `rm`, `prune` and `gc` find it
        print(f"[trainctl] the controller log stays on this machine: {exc}", flush=True)
    return 0 if record.state.value == "Completed" else 1


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainctl-controller serve")
    parser.add_argument("--store", required=True)
    parser.add_argument("--id", required=True, dest="service_id")
    parser.add_argument("--idle-seconds", type=float, default=None)
    parser.add_argument(
        "--on-idle",
        choices=["terminate-instance"],
        default=None,
        help="after the idle period: terminate --instance-id (an EC2 controller's own)",
    )
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--region", default=None)
    args = parser.parse_args(argv)
    if args.on_idle and not (args.instance_id and args.region):
        parser.error("--on-idle terminate-instance needs --instance-id and --region")

    from trainctl.controller.service import ControllerService
    from trainctl.spec.settings import get_settings
    from trainctl.store import open_store

    on_idle = None
    holder: dict[str, str] = {}
    if args.on_idle == "terminate-instance":
        from trainctl.provisioning.aws.controller import terminate_own_instance

        holder = {"instance_id": args.instance_id, "region": args.region}

        def on_idle() -> None:
            terminate_own_instance(args.instance_id, args.region)

    service = ControllerService(
        open_store(args.store),
        args.service_id,
        idle_seconds=args.idle_seconds or get_settings().controller_idle_seconds,
        on_idle=on_idle,
        holder=holder,
    )
    return service.run()


if __name__ == "__main__":
    sys.exit(main())
