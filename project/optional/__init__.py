"""Optional parts: each folder here can be deleted with the paths `parts.yaml` lists for it."""
