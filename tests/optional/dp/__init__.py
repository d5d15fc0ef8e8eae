"""Tests of trainer=dp."""
