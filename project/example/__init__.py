"""The worked example: a classifier (its networks, metric and data modules) that you replace with your own."""
