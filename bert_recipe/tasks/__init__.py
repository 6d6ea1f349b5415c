"""The tasks' data and metrics, without a model: GLUE (glue.py), SWAG (swag.py) and SQuAD (squad.py: examples and
windows; squad_cache.py, squad_answers.py, squad_metrics.py). Fine-tuning trains on them and prediction answers with
them, so this floor sits below both."""
