"""The command-line tools: one module per ``crossrt`` subcommand, each ``main(argv) -> int``."""
