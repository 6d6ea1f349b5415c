"""Fine-tuning: the configurations of run_glue.py, run_squad.py and run_swag.py, and the recipe they share. The
tasks' readers and metrics are bert_recipe.tasks; prediction is bert_recipe.prediction."""
