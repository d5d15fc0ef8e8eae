"""Tests of logger=mlflow."""
