"""Loggers that Lightning ships, adapted to a run of this project (conf/logger/ picks them)."""
