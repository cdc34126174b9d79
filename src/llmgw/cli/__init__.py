"""Command line: the only place where long-lived objects are built and wired."""
