"""Tests of trainer=fsdp and its sharded checkpoints."""
