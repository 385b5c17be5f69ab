"""Probes of a training run: its geometry study, a look at a target still training, a VQ's oracle
MuLo-SD table. They read a run folder (and so import ``mulo.train``); only the CLI imports them."""
