"""Prediction with a model that is already trained: what inference.py, extract_features.py, the Triton scripts and
the fine-tuning recipe's evaluation share (predict.py: model files, batches, the runtime, the two tasks as
functions; items.py: the --input_file items and the text checks). Named prediction, not inference, so that
`bert_recipe.prediction` and the top-level command inference.py are never mistaken for each other."""
