"""One module per ``farm`` subcommand: ``configure(parser)`` + ``run(args) -> int``.

A command imports what its ``run`` needs inside ``run`` (and its helpers), not at the top:
``farm.cli`` imports every command's module to build the parser, so an import at the top of
one would load its dependencies (Ray, pyarrow, the engine, the report's renderer, ...) for
every command and every ``farm --help``. Only what ``configure`` itself needs is at the top."""
