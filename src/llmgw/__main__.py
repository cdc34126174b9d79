"""`python -m llmgw` is the same as the `llmgw` command."""

from llmgw.cli.main import main

main()
