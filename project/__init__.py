"""A Lightning + Hydra training template with a raw-PyTorch reference path beside it."""
