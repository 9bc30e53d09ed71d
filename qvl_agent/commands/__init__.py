"""One module per `qvl-agent` subcommand; see `qvl_agent.cli`."""
