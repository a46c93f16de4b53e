"""``python -m multibackend``: see :mod:`multibackend.cli`."""
from .cli import main

raise SystemExit(main())
