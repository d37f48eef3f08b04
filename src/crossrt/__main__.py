"""``python -m crossrt`` is the ``crossrt`` command."""

from crossrt.tools.cli import main

raise SystemExit(main())
