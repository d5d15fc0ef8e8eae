"""`trainer=fsdp`: FSDP2 sharding for any LightningModule, and its sharded checkpoints."""
