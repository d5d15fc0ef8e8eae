"""Tests of the raw-PyTorch reference path, compare and parity."""
