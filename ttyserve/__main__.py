"""`python -m ttyserve` is the `ttyserve` command."""

from .cli.main import main

main()
