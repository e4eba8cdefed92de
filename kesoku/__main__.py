"""``python -m kesoku`` runs the CLI."""

from kesoku.cli import main

main()
