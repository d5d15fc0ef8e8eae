"""`data=image_folder`: images of your own, read from disk by DataLoader workers."""
