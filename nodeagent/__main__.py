"""`python -m nodeagent`: the same entry point as the `nodeagent` console script."""

from nodeagent.cli import main

raise SystemExit(main())
