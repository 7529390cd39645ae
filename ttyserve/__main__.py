"""`python -m ttyserve` is the `ttyserve` command."""

from .cli import main

main()
