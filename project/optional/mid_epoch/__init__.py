"""`last.ckpt` inside epochs: every N steps, every M minutes, and on SIGTERM."""
