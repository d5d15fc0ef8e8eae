"""Tests of data=image_folder."""
