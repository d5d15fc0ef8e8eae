"""`trainer=dp`: DataParallel, one process splitting each batch over the GPUs."""
