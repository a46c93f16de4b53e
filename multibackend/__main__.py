"""``python -m multibackend``: see :mod:`multibackend.cli`."""
from multibackend.cli import main

raise SystemExit(main(prog="python -m multibackend"))
