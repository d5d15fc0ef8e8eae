"""`logger=mlflow`: MLflow runs named after the run dir, harmless when the server goes away."""
