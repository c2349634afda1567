"""Subcommands of the `constraintd` command line; one module each, with `add_arguments` and `run`."""
