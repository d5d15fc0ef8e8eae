"""Tests of multi-node torchrun (project.optional.torchrun, scripts/torchrun/)."""
