"""The stages of a training run, one module each, in the order ``mulo.train.pipeline`` runs them."""
