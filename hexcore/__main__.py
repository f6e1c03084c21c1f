"""``python -m hexcore``: the hexcore command."""

from .cli import main

raise SystemExit(main())
