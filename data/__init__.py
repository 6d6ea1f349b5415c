"""Pre-training data pipeline: download, text formatting, sentence segmentation, sharding (see data/README.md)."""
