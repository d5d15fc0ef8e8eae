"""Optional parts: each folder here is one, and `make remove-part PART=<name>` deletes it with every other path that
`parts.yaml` lists for it (its conf files, tests, docs page); nothing outside a part imports it."""
