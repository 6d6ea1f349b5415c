"""The data pipeline's stages: formatting, sharding, vocabularies, the engines that run them."""
