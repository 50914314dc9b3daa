"""minidist's Hydra launcher and sweeper (Hydra loads plugins from the hydra_plugins namespace)."""
