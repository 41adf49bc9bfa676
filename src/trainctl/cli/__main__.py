"""python -m trainctl.cli: the same as the `trainctl` command."""

from trainctl.cli import main

main()
