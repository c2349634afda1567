"""`python -m sampler_worker`: the sampler-worker command line."""

from sampler_worker.cli import main

raise SystemExit(main())
